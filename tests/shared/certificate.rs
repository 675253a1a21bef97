//! A throw-away certificate authority for tests that speak TLS: shared by
//! the `it` and `cluster` test binaries (each includes this file as a
//! module), so there is one way to make one.

/// A CA (PEM) and a server certificate and key (PEM) it signed for `names`.
pub fn server_certificate(names: &[&str]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("server key");
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names).expect("params").signed_by(&key, &issuer).expect("server cert");
    (ca.pem(), cert.pem(), key.serialize_pem())
}
