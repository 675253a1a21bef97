//! The `pacpriv.v1.Admin` service, on its own listener: provisioning
//! principals; and beside it the model repository's load and unload
//! ([`repository`]). Every call must carry the admin token
//! (`authorization: Bearer <token>`); a client API key is not one, and the
//! client listener does not serve these calls at all.
//!
//! A request's path: [`check_token`] → the RPC's file ([`create`],
//! [`list`], [`inspect`], [`revoke`], [`rotate`], [`export`], [`noise_keys`], [`repository`]) → [`super::status`] for any error.
//! There is no reset and no raise: see `proto/pacpriv/v1/admin.proto`.

pub mod create;
pub mod export;
pub mod inspect;
pub mod list;
pub mod noise_keys;
pub mod repository;
pub mod revoke;
pub mod rotate;

use super::App;
use super::auth::api_key;
use super::output;
use super::status::ServiceError;
use crate::metrics::ServiceMetrics;
use crate::proto::pacpriv::admin_server::Admin;
use crate::proto::pacpriv::{
    CreatePrincipalRequest, CreatePrincipalResponse, ExportJournalRequest, ExportNoiseKeysRequest,
    InspectPrincipalRequest, ListPrincipalsRequest, ListPrincipalsResponse, NoiseKeys, Principal,
    RevokePrincipalRequest, RotateKeyRequest,
};
use crate::session::{Account, Sessions};
use pacpriv_privacy::report;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tonic::{Request, Response, Status};

/// The admin service.
pub struct AdminService {
    app: Arc<App>,
    token_sha256: [u8; 32],
}

impl AdminService {
    /// Serves `app`'s principals to holders of the token hashing to
    /// `token_sha256`.
    pub fn new(app: Arc<App>, token_sha256: [u8; 32]) -> Self {
        AdminService { app, token_sha256 }
    }

    fn check_token<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check_token(request, &self.token_sha256)
    }
}

/// The admin listener's gate: every call to its services (the admin API
/// and the repository's load and unload) is refused from its headers,
/// before a byte of its body is read or decoded, unless it carries the
/// admin token (issue 67 §5). The handlers check again.
pub fn token_gate(token_sha256: [u8; 32]) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request| {
        check_token(&request, &token_sha256)?;
        crate::net::connection::authenticated(request.extensions(), "(admin)");
        Ok(request)
    }
}

/// Checks that `request` carries the admin token hashing to
/// `token_sha256`, in time independent of where the digests differ.
fn check_token<T>(request: &Request<T>, token_sha256: &[u8; 32]) -> Result<(), Status> {
    let presented: [u8; 32] = match api_key(request.metadata().as_ref()) {
        Some(token) => Sha256::digest(token.as_bytes()).into(),
        None => return Err(unauthenticated()),
    };
    if bool::from(presented.ct_eq(token_sha256)) { Ok(()) } else { Err(unauthenticated()) }
}

fn unauthenticated() -> Status {
    super::status::with_reason(
        tonic::Code::Unauthenticated,
        "the admin API needs the admin token as `authorization: Bearer <token>`".into(),
        super::status::reason::UNAUTHENTICATED,
        false,
        &[],
    )
}

/// The wire form of an account.
fn principal_message(a: &Account) -> Principal {
    let p = &a.principal;
    let datasets: Vec<_> = a.datasets.iter().map(|d| output::budget(&p.name, &d.dataset, d.scope, &d.budget)).collect();
    Principal {
        name: p.name.clone(),
        origin: p.origin.as_str().to_owned(),
        budget_mi: p.budget,
        revoked: !p.active(),
        created_unix: p.created_unix,
        revoked_unix: p.revoked_unix,
        // Under global scope this is the shared session's account.
        account: datasets.first().cloned(),
        epsilon_equivalent: a.datasets.first().map_or(0.0, |d| report::epsilon_equivalent(d.budget.mia_bound)),
        datasets,
    }
}

/// Keeps the principal gauges in step after a change.
async fn refresh_gauges(sessions: &Sessions, metrics: &ServiceMetrics) -> Result<(), ServiceError> {
    metrics.principals(sessions.active_count().await?);
    Ok(())
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_principal(
        &self,
        request: Request<CreatePrincipalRequest>,
    ) -> Result<Response<CreatePrincipalResponse>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(create::apply(&self.app, create::parse(request.into_inner())?).await?))
    }

    async fn list_principals(
        &self,
        request: Request<ListPrincipalsRequest>,
    ) -> Result<Response<ListPrincipalsResponse>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(list::apply(&self.app).await?))
    }

    async fn inspect_principal(
        &self,
        request: Request<InspectPrincipalRequest>,
    ) -> Result<Response<Principal>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(inspect::apply(&self.app, &request.into_inner().name).await?))
    }

    async fn revoke_principal(&self, request: Request<RevokePrincipalRequest>) -> Result<Response<Principal>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(revoke::apply(&self.app, &request.into_inner().name).await?))
    }

    async fn rotate_key(
        &self,
        request: Request<RotateKeyRequest>,
    ) -> Result<Response<CreatePrincipalResponse>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(rotate::apply(&self.app, &request.into_inner().name).await?))
    }

    type ExportJournalStream = export::ChunkStream;

    async fn export_journal(
        &self,
        request: Request<ExportJournalRequest>,
    ) -> Result<Response<Self::ExportJournalStream>, Status> {
        self.check_token(&request)?;
        export::parse(&self.app)?;
        Ok(Response::new(export::apply(self.app.clone())))
    }

    async fn export_noise_keys(&self, request: Request<ExportNoiseKeysRequest>) -> Result<Response<NoiseKeys>, Status> {
        self.check_token(&request)?;
        Ok(Response::new(noise_keys::apply(&self.app)))
    }
}
