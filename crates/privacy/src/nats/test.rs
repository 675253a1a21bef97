use super::*;

#[test]
fn parses_powers_of_two_exactly() -> Result<(), PrivacyError> {
    assert_eq!("2^-32".parse::<Nats>()?.get(), 1.0 / 4294967296.0);
    assert_eq!("2**-8".parse::<Nats>()?.get(), 1.0 / 256.0);
    assert_eq!(" 2^(-4) ".parse::<Nats>()?.get(), 0.0625);
    Ok(())
}

#[test]
fn parses_decimals() -> Result<(), PrivacyError> {
    assert_eq!("0.0039".parse::<Nats>()?.get(), 0.0039);
    assert_eq!("1e-5".parse::<Nats>()?.get(), 1e-5);
    Ok(())
}

#[test]
fn rejects_negative_nan_infinite_and_garbage() {
    for s in ["-1", "NaN", "inf", "2^x", "", "two", "2^-2000"] {
        assert!(s.parse::<Nats>().is_err(), "{s} should be rejected");
    }
    assert!(Nats::new(f64::NAN).is_err());
    assert!(Nats::new(-0.5).is_err());
    assert_eq!(Nats::new(-0.0).map(Nats::get).map(f64::is_sign_positive), Ok(true));
}

#[test]
fn display_round_trips() -> Result<(), PrivacyError> {
    for v in [2f64.powi(-32), 0.1, 1.0 / 3.0, 0.0] {
        let n = Nats::new(v)?;
        assert_eq!(n.to_string().parse::<Nats>()?, n);
    }
    Ok(())
}
