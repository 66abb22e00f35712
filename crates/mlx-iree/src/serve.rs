//! `mlx-iree serve`: flags -> an engine and an OpenAI-compatible server on it (crates/server).

use crate::run::ModelArgs;
use anyhow::{Context, Result, bail};
use server::{Generator, Server, ServerConfig};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) draft: crate::run::DraftArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded together (KV slots); more wait in the queue.
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Requests that may wait for a slot; beyond them the server answers 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` on /v1/*.
    #[arg(long)]
    api_key: Option<String>,
    /// The model id clients name (default: the repo id, or the model folder's name).
    #[arg(long)]
    model_id: Option<String>,
    /// Seconds requests in flight may take to finish after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); Ctrl-C still stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

pub fn run(args: &ServeArgs) -> Result<()> {
    let dir = &args.model.model;
    let config = crate::run::check_model_dir(dir)?;
    args.model.check_draft(&config)?;
    if args.max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    args.model.plan(&config, args.max_batch, 2, "a one-token prompt and its answer")?;
    let address = format!("{}:{}", args.host, args.port);
    // Fail on a taken port now, not after minutes of compiling (the port is bound again
    // once the model is loaded: nothing listens before every graph is ready).
    drop(std::net::TcpListener::bind(&address).with_context(|| format!("cannot listen on {address}"))?);
    let model_id = match (&args.model_id, &args.model.repo) {
        (Some(id), _) | (None, Some(id)) => id.clone(),
        (None, None) => {
            dir.canonicalize()?.file_name().map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
        }
    };
    let model = Arc::new(
        Generator::load(dir, args.model.engine_config(args.max_batch)?)
            .with_context(|| format!("loading {}", dir.display()))?,
    );
    let info = model.scheduler.info().clone();
    let server = Server::new(
        Arc::clone(&model),
        ServerConfig {
            api_key: args.api_key.clone(),
            queue_limit: args.queue,
            shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
            ..ServerConfig::new(&model_id)
        },
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(&address).await.with_context(|| format!("cannot listen on {address}"))?;
        eprintln!(
            "listening on http://{} (model `{model_id}`, {} slots x {} positions, {} KV cache MiB, {})",
            listener.local_addr()?,
            info.max_batch,
            info.max_context,
            info.load.kv_bytes >> 20,
            info.load.compile,
        );
        server.run(listener, shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    // Requests are done (or abandoned): stop the engine thread before exiting.
    drop(server);
    drop(runtime);
    drop(model);
    eprintln!("server stopped");
    Ok(())
}
