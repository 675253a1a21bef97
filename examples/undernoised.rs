//! BROKEN ON PURPOSE: `pacpriv serve` on the built-in configuration (and
//! `PACPRIV__…` overrides), except that Σ is calibrated to 2¹⁶·b while b is
//! charged ([`Calibration::UnderNoisedForAuditTests`]) — answers far less
//! noisy than the accounting says. It exists so that `tests/it/canaries.rs`
//! can show `pacpriv audit --canaries` catching a mechanism that leaks more
//! than it charges. Built as the binary `pacpriv-undernoised` (beside
//! `pacpriv`, so the tests get it); the image copies only `pacpriv`, and the
//! `pacpriv` binary has no way to select this calibration.

use pacpriv_privacy::mechanism::Calibration;
use pacpriv_service::settings::Settings;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut out = std::io::stdout().lock();
    let mut run = || -> anyhow::Result<()> {
        let mut settings = Settings::load(None)?;
        settings.calibration = Calibration::UnderNoisedForAuditTests { factor: 65_536.0 };
        pacpriv::cli::serve::serve_settings(settings, None, &mut out)
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
