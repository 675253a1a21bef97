//! `pacpriv admin`: the admin API from the command line — create, list,
//! inspect, revoke and rotate principals on a running server, export its
//! journal for `pacpriv verify`, and list, load and unload its model
//! versions (the repository calls of the admin listener). The admin token is
//! read from `PACPRIV_ADMIN_TOKEN` (not a flag, so it stays out of shell
//! history and `ps`).

use super::connect::{TlsArgs, channel};
use super::verify::{format, keys};
use crate::plural;
use anyhow::Context;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_service::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use pacpriv_service::proto::inference::model_repository_parameter::ParameterChoice;
use pacpriv_service::proto::inference::{
    ModelRepositoryParameter, RepositoryIndexRequest, RepositoryModelLoadRequest, RepositoryModelUnloadRequest,
};
use pacpriv_service::proto::pacpriv::admin_client::AdminClient;
use pacpriv_service::proto::pacpriv::journaled::Item;
use pacpriv_service::proto::pacpriv::{
    CreatePrincipalRequest, ExportJournalRequest, ExportNoiseKeysRequest, InspectPrincipalRequest,
    ListPrincipalsRequest, Principal, RevokePrincipalRequest, RotateKeyRequest,
};
use pacpriv_store::{JournalEntry, JournalEvent, SessionRecord};
use std::collections::HashMap;
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
        /// MI budget in nats ("2^-8" or a decimal): its limit in the
        /// default dataset and in every other not given below.
        #[arg(long)]
        budget_mi: String,
        /// Its limit in another dataset, DATASET=NATS (repeatable).
        #[arg(long = "dataset-budget-mi", value_name = "DATASET=NATS", value_parser = dataset_budget)]
        dataset_budget_mi: Vec<(String, String)>,
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
    /// Give an admin-created principal a new API key (printed once); the
    /// old key stops working at once, the spending stays.
    Rotate {
        /// Its name.
        name: String,
    },
    /// Every model version and its state (READY, or UNAVAILABLE and why).
    Models,
    /// Let new requests reach a model's versions again (every version, or
    /// `--version`).
    Load {
        /// The model.
        name: String,
        /// One version of it.
        #[arg(long)]
        version: Option<String>,
    },
    /// Refuse new requests to a model's versions on this server (every
    /// version, or `--version`); requests already answering finish.
    Unload {
        /// The model.
        name: String,
        /// One version of it.
        #[arg(long)]
        version: Option<String>,
    },
    /// Write every session's journal and record as JSON Lines, for
    /// `pacpriv verify` (needs `store.journal = true`); with `--noise-key`,
    /// every dataset's noise key.
    Export {
        /// Where to write the journal (default: standard output, unless
        /// only `--noise-key` is given).
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
        /// Also write every dataset's noise key to FILE (created readable
        /// by its owner alone), for `pacpriv verify --noise-key`. Its holder
        /// can recompute every release's noise, and so tell the secret
        /// index: hand it only to an auditor the data owner trusts.
        #[arg(long, value_name = "FILE")]
        noise_key: Option<std::path::PathBuf>,
    },
}

/// A principal's line: its default dataset's account, then one indented
/// line per further dataset.
fn line(p: &Principal) -> String {
    let a = p.account.clone().unwrap_or_default();
    let mut text = format!(
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
    );
    for d in p.datasets.iter().skip(1) {
        text.push_str(&format!(
            "\n  dataset={}\tspent={:e}\tlimit={:e}\tremaining={:e}\tanswered={}\tmia_bound={:.6}",
            d.dataset, d.spent, d.limit, d.remaining, d.answered, d.mia_bound
        ));
    }
    text
}

/// A load or unload's parameters: the version, if one is named.
fn version_parameter(version: Option<String>) -> HashMap<String, ModelRepositoryParameter> {
    version
        .map(|v| {
            ("version".to_owned(), ModelRepositoryParameter { parameter_choice: Some(ParameterChoice::StringParam(v)) })
        })
        .into_iter()
        .collect()
}

/// What an export wrote.
struct Exported {
    entries: u64,
    events: u64,
    sessions: u64,
}

/// Streams the server's journal export to `out` as JSON Lines
/// ([`crate::verify::format`]).
async fn export<T>(admin: &mut AdminClient<T>, out: &mut dyn Write) -> anyhow::Result<Exported>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut stream = admin.export_journal(ExportJournalRequest {}).await?.into_inner();
    serde_json::to_writer(&mut *out, &format::Header { format: format::FORMAT.into() })?;
    writeln!(out)?;
    let (mut entries, mut events, mut sessions) = (0, 0, 0);
    while let Some(chunk) = stream.message().await? {
        for item in chunk.journal.iter().filter_map(|j| j.item.as_ref()) {
            let undecodable = || format!("the server sent an undecodable journal item of {:?}", chunk.session);
            match item {
                Item::Entry(bytes) => {
                    let entry = JournalEntry::decode(bytes).with_context(undecodable)?;
                    serde_json::to_writer(&mut *out, &format::EntryLine::of(&chunk.session, &entry))?;
                    entries += 1;
                }
                Item::Event(bytes) => {
                    let event = JournalEvent::decode_sealed(bytes).with_context(undecodable)?;
                    serde_json::to_writer(&mut *out, &format::EventLine::of(&chunk.session, &event))?;
                    events += 1;
                }
            }
            writeln!(out)?;
        }
        if !chunk.record.is_empty() {
            let record = SessionRecord::decode(&chunk.record)
                .with_context(|| format!("the server sent an undecodable record of {:?}", chunk.session))?;
            let line = format::SessionLine { session: chunk.session.clone(), record: format::RecordLine::of(&record) };
            serde_json::to_writer(&mut *out, &line)?;
            writeln!(out)?;
            sessions += 1;
        }
    }
    Ok(Exported { entries, events, sessions })
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
        let channel = channel(&args.addr, &args.tls, "the admin listener").await?;
        let bearer = move |mut req: tonic::Request<()>| {
            req.metadata_mut().insert("authorization", value.clone());
            Ok(req)
        };
        let mut admin = AdminClient::with_interceptor(channel.clone(), bearer.clone());
        let mut repository = GrpcInferenceServiceClient::with_interceptor(channel, bearer);
        match args.action {
            Action::Create { name, budget_mi, dataset_budget_mi } => {
                let dataset_budget_mi = dataset_budget_mi.into_iter().collect();
                let request = CreatePrincipalRequest { name, budget_mi, dataset_budget_mi };
                let created = admin.create_principal(request).await?.into_inner();
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
            Action::Rotate { name } => {
                let rotated = admin.rotate_key(RotateKeyRequest { name }).await?.into_inner();
                if let Some(p) = &rotated.principal {
                    writeln!(out, "{}", line(p))?;
                }
                writeln!(out, "api_key={}", rotated.api_key)?;
            }
            Action::Models => {
                let index = repository.repository_index(RepositoryIndexRequest::default()).await?.into_inner();
                for m in index.models {
                    let reason = if m.reason.is_empty() { String::new() } else { format!("\treason={}", m.reason) };
                    writeln!(out, "{}\tversion={}\tstate={}{reason}", m.name, m.version, m.state)?;
                }
            }
            Action::Load { name, version } => {
                let parameters = version_parameter(version);
                let request = RepositoryModelLoadRequest { model_name: name.clone(), parameters, ..Default::default() };
                repository.repository_model_load(request).await?;
                writeln!(out, "loaded {name}")?;
            }
            Action::Unload { name, version } => {
                let parameters = version_parameter(version);
                let request =
                    RepositoryModelUnloadRequest { model_name: name.clone(), parameters, ..Default::default() };
                repository.repository_model_unload(request).await?;
                writeln!(out, "unloaded {name}")?;
            }
            Action::Export { out: journal, noise_key } => {
                if let Some(path) = &noise_key {
                    let keys = admin.export_noise_keys(ExportNoiseKeysRequest {}).await?.into_inner().keys;
                    let keys: Vec<(String, NoiseKey)> = keys
                        .into_iter()
                        .map(|k| {
                            let bytes: [u8; 32] = k
                                .key
                                .try_into()
                                .map_err(|_| anyhow::anyhow!("the server sent a key of another size"))?;
                            Ok((k.dataset, NoiseKey::from_bytes(bytes)))
                        })
                        .collect::<anyhow::Result<_>>()?;
                    keys::write(path, &keys)?;
                    let datasets: Vec<&str> = keys.iter().map(|(d, _)| d.as_str()).collect();
                    writeln!(out, "wrote the noise keys of {} to {}", datasets.join(", "), path.display())?;
                }
                match journal {
                    None if noise_key.is_some() => {}
                    None => {
                        export(&mut admin, out).await?;
                    }
                    Some(path) => export_to(&mut admin, &path, out).await?,
                }
            }
        }
        Ok(())
    })
}

/// [`export`] to the file `path`, saying what was written on `out`.
async fn export_to<T>(admin: &mut AdminClient<T>, path: &std::path::Path, out: &mut dyn Write) -> anyhow::Result<()>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let file = std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    let mut file = std::io::BufWriter::new(file);
    let Exported { entries, events, sessions } = export(admin, &mut file).await?;
    file.flush().with_context(|| format!("cannot write {}", path.display()))?;
    let (s, e) = (plural(sessions), plural(events));
    writeln!(
        out,
        "exported {entries} journal entries and {events} event{e} of {sessions} session{s} to {}",
        path.display()
    )?;
    Ok(())
}

/// `DATASET=NATS` of `--dataset-budget-mi`.
fn dataset_budget(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((dataset, nats)) if !dataset.is_empty() && !nats.is_empty() => Ok((dataset.to_owned(), nats.to_owned())),
        _ => Err(format!("{s:?} is not DATASET=NATS (e.g. census=2^-10)")),
    }
}
