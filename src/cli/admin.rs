//! `pacpriv admin`: the admin API from the command line — create, list,
//! inspect and revoke principals on a running server. The admin token is
//! read from `PACPRIV_ADMIN_TOKEN` (not a flag, so it stays out of shell
//! history and `ps`).

use super::connect::{TlsArgs, channel};
use crate::proto::pacpriv::admin_client::AdminClient;
use crate::proto::pacpriv::{
    CreatePrincipalRequest, InspectPrincipalRequest, ListPrincipalsRequest, Principal, RevokePrincipalRequest,
};
use anyhow::Context;
use std::io::Write;

/// Arguments of `pacpriv admin`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The admin listener (`admin.listen`).
    #[arg(long, default_value = "127.0.0.1:50052", value_name = "HOST:PORT")]
    pub addr: String,
    /// TLS (`--ca`) and mTLS (`--cert`, `--key`) to the admin listener.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// Admin actions.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Provision a principal; prints its API key once.
    Create {
        /// 1 to 64 letters, digits, '_', '.' or '-'.
        name: String,
        /// MI budget in nats ("2^-8" or a decimal).
        #[arg(long)]
        budget_mi: String,
    },
    /// Every principal, one line each.
    List,
    /// One principal's account.
    Inspect {
        /// Its name.
        name: String,
    },
    /// Stop a principal's key from working, for good.
    Revoke {
        /// Its name.
        name: String,
    },
}

fn line(p: &Principal) -> String {
    let a = p.account.clone().unwrap_or_default();
    format!(
        "{name}\torigin={origin}\trevoked={revoked}\tspent={spent:e}\tlimit={limit:e}\tremaining={remaining:e}\t\
         answered={answered}\tmia_bound={mia:.6}\tepsilon={eps:.6}",
        name = p.name,
        origin = p.origin,
        revoked = p.revoked,
        spent = a.spent,
        limit = a.limit,
        remaining = a.remaining,
        answered = a.answered,
        mia = a.mia_bound,
        eps = p.epsilon_equivalent,
    )
}

/// Runs one admin action against `--addr`.
///
/// # Errors
/// No token in the environment, an unreachable server, or the server's
/// refusal (its message says why).
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let token = std::env::var("PACPRIV_ADMIN_TOKEN")
        .context("set PACPRIV_ADMIN_TOKEN to the admin token whose SHA-256 is admin.key_sha256")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let value: tonic::metadata::MetadataValue<_> =
            format!("Bearer {token}").parse().context("the admin token must be printable ASCII")?;
        let mut admin = AdminClient::with_interceptor(
            channel(&args.addr, &args.tls, "the admin listener").await?,
            move |mut req: tonic::Request<()>| {
                req.metadata_mut().insert("authorization", value.clone());
                Ok(req)
            },
        );
        match args.action {
            Action::Create { name, budget_mi } => {
                let created = admin.create_principal(CreatePrincipalRequest { name, budget_mi }).await?.into_inner();
                if let Some(p) = &created.principal {
                    writeln!(out, "{}", line(p))?;
                }
                writeln!(out, "api_key={}", created.api_key)?;
            }
            Action::List => {
                for p in admin.list_principals(ListPrincipalsRequest {}).await?.into_inner().principals {
                    writeln!(out, "{}", line(&p))?;
                }
            }
            Action::Inspect { name } => {
                let p = admin.inspect_principal(InspectPrincipalRequest { name }).await?.into_inner();
                writeln!(out, "{}", line(&p))?;
            }
            Action::Revoke { name } => {
                let p = admin.revoke_principal(RevokePrincipalRequest { name }).await?.into_inner();
                writeln!(out, "{}", line(&p))?;
            }
        }
        Ok(())
    })
}
