//! The `egressd` command line. Everything it runs lives in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};

use egressd::runtime::watch::WatchOptions;
use egressd::{Options, Proxy};

#[derive(Parser)]
#[command(
    name = "egressd",
    version,
    about = "Layer-7 egress/backend proxy driven by Backend definitions in YAML"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a RUST_LOG-style directive).
    /// Defaults to RUST_LOG, then `info`.
    #[arg(long, global = true, env = "EGRESSD_LOG_LEVEL")]
    log_level: Option<String>,
    /// Largest config file read, in bytes or as a quantity (`1Mi`); a larger file is an error.
    #[arg(long, global = true, env = "EGRESSD_MAX_CONFIG_FILE_SIZE", value_parser = parse_size,
          default_value = "1Mi")]
    max_config_file_size: u64,
    /// Largest config in all (every file of every config path); beyond it, an error.
    #[arg(long, global = true, env = "EGRESSD_MAX_CONFIG_SIZE", value_parser = parse_size,
          default_value = "16Mi")]
    max_config_size: u64,
    /// Bytes YAML anchors and aliases may copy in one file (memory, about 60 bytes per value
    /// plus its text); beyond it, an error.
    #[arg(long, global = true, env = "EGRESSD_MAX_CONFIG_ALIAS_EXPANSION",
          value_parser = parse_size, default_value = "4Mi")]
    max_config_alias_expansion: u64,
    /// How long each step of a config load (read, parse, check, assemble) may take; a step
    /// that takes longer (a file on a hung network mount) fails the reload, which is reported
    /// like any other failure, and the last good config keeps serving.
    #[arg(long, global = true, env = "EGRESSD_RELOAD_TIMEOUT",
          value_parser = egressd::config::units::parse_duration, default_value = "60s")]
    reload_timeout: std::time::Duration,
    /// Lines each repeated warning (a refused connection, a failed accept: messages traffic
    /// can cause once per event) may log per 10 s; the rest are counted and reported in one
    /// "N similar messages suppressed" line. 0: no limit.
    #[arg(long, global = true, env = "EGRESSD_LOG_RATE_LIMIT", default_value_t = egressd::telemetry::log_limit::DEFAULT_LINES_PER_WINDOW)]
    log_rate_limit: u32,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve traffic with the config in DIR (reloaded on change and on SIGHUP).
    Run {
        /// Config directory or file; repeat for several.
        #[arg(long, short = 'c', default_value = "config")]
        config: Vec<PathBuf>,
        /// Worker threads serving traffic (default: one per CPU).
        #[arg(long)]
        workers: Option<usize>,
        /// Admin listener address; overrides ProxyConfig.spec.admin.address.
        #[arg(long)]
        admin_address: Option<SocketAddr>,
        /// Do not watch the config for changes (SIGHUP still reloads).
        #[arg(long)]
        no_watch: bool,
        /// Write the bound admin address (ip:port) to this file once listening; useful with
        /// an ephemeral admin port (`--admin-address 127.0.0.1:0`).
        #[arg(long)]
        admin_address_file: Option<PathBuf>,
    },
    /// Check a config without serving it: prints every error and each object's conditions;
    /// exit status 1 if there is any error.
    Validate {
        /// Every warning is an error (as `ProxyConfig.spec.strict: true` makes it for reloads).
        #[arg(long)]
        strict: bool,
        /// List every object's conditions, not only what is not fine.
        #[arg(long, short = 'v')]
        verbose: bool,
        /// Config directories or files.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Validate a config like `validate`; with --probe, also connect to every Backend
    /// endpoint (TLS handshake with the Backend's settings, or TCP connect for plaintext) and
    /// report what happened. Exit status 1 if the config is invalid or any probe fails.
    Check {
        /// Resolve destinations and connect to every endpoint.
        #[arg(long)]
        probe: bool,
        /// A concrete host to probe under the wildcard Backend that covers it
        /// (`--probe-host api.example.com` for `*.example.com`); repeatable.
        #[arg(long = "probe-host", value_name = "HOST", requires = "probe")]
        probe_hosts: Vec<String>,
        /// Config directories or files.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Print the JSON Schema of every config kind (for yaml-language-server and CI).
    Schema,
    /// Ask a running egressd's admin server for PATH; exit status 0 when it answers 200. For
    /// exec probes (`egressd healthcheck /ready`) where the admin server listens on loopback.
    Healthcheck {
        /// `/healthz` (the process runs) or `/ready` (a config serves, not draining).
        #[arg(default_value = "/healthz")]
        path: String,
        /// The admin server's address.
        #[arg(long, default_value = "127.0.0.1:15000")]
        admin_address: SocketAddr,
        /// How long to wait for the answer.
        #[arg(long, value_parser = egressd::config::units::parse_duration, default_value = "2s")]
        timeout: std::time::Duration,
    },
    /// The CA HTTPS interception signs leaf certificates with (`ProxyConfig.spec.tlsInterception`).
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
}

#[derive(Subcommand)]
enum CaCommand {
    /// Make a new CA (ECDSA P-256) in DIR: ca.crt, for clients to trust, and ca.key (mode
    /// 0600), for egressd only. Never overwrites either file.
    Init {
        /// Directory to write ca.crt and ca.key into (made if missing).
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = egressd::commands::CA_DEFAULT_NAME)]
        name: String,
        /// Let the CA sign only for this DNS name and the names under it (X.509 name
        /// constraints, which clients enforce); repeat for several. Default: any name.
        #[arg(long = "permitted-dns", value_name = "SUFFIX")]
        permitted_dns: Vec<String>,
        /// Permit exactly the names this config could intercept (its Backends' hostnames
        /// whose TLS egressd originates, and its routes' hostnames), besides any
        /// --permitted-dns.
        #[arg(long = "config", value_name = "DIR")]
        config: Vec<PathBuf>,
        /// Days until the CA expires. 825: two years of use, and three months to roll out its
        /// successor.
        #[arg(long, value_name = "DAYS",
              default_value_t = egressd::commands::CA_DEFAULT_VALIDITY_DAYS)]
        validity: u32,
    },
}

// jemalloc, with a background thread returning memory unused for a second (`.cargo/config.toml`):
// after a burst of connections closes, glibc's malloc kept its ~20 MB in the process for good
// (fragmented across its arenas); jemalloc gives it back within seconds.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref());
    egressd::config::LoadLimits {
        max_file_bytes: cli.max_config_file_size,
        max_total_bytes: cli.max_config_size,
        max_alias_bytes: usize::try_from(cli.max_config_alias_expansion).unwrap_or(usize::MAX),
        reload_timeout: cli.reload_timeout,
    }
    .install();
    egressd::telemetry::log_limit::set_lines_per_window(cli.log_rate_limit);
    match cli.command {
        Command::Validate {
            paths,
            strict,
            verbose,
        } => {
            let options = egressd::commands::ValidateOptions { strict, verbose };
            print_validation(&egressd::commands::validate_with(&paths, options))
        }
        Command::Check {
            probe: false,
            paths,
            ..
        } => print_validation(&egressd::commands::validate(&paths)),
        Command::Check {
            probe: true,
            paths,
            probe_hosts,
        } => check_probe(&paths, &probe_hosts),
        Command::Healthcheck {
            path,
            admin_address,
            timeout,
        } => match egressd::commands::healthcheck(admin_address, &path, timeout) {
            Ok(200) => ExitCode::SUCCESS,
            Ok(status) => {
                eprintln!("egressd healthcheck: {admin_address}{path} answered {status}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("egressd healthcheck: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Ca { command } => ca(command),
        Command::Schema => {
            let schema = egressd::config::schema::json_schema();
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Command::Run {
            config,
            workers,
            admin_address,
            no_watch,
            admin_address_file,
        } => {
            let workers = workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let options = Options {
                config,
                workers,
                admin_address,
                watch: (!no_watch).then(WatchOptions::default),
            };
            run(options, admin_address_file)
        }
    }
}

/// Prints `egressd validate`'s report; the exit status says whether the config is valid.
fn print_validation(v: &egressd::commands::Validation) -> ExitCode {
    print!("{}", v.report);
    if v.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `egressd ca init`: writes the CA and says where it is, its fingerprint, and how to trust it.
fn ca(command: CaCommand) -> ExitCode {
    let CaCommand::Init {
        dir,
        name,
        mut permitted_dns,
        config,
        validity,
    } = command;
    if !config.is_empty() {
        match egressd::commands::interception_names(&config) {
            Ok(names) if names.is_empty() => {
                eprintln!("egressd ca init: the config names nothing egressd could intercept (no Backend port whose TLS it originates, no route hostname)");
                return ExitCode::FAILURE;
            }
            Ok(names) => {
                println!(
                    "permitted DNS names (from the config): {}",
                    names.join(", ")
                );
                permitted_dns.extend(names);
            }
            Err(e) => {
                eprintln!("egressd ca init --config: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let options = egressd::commands::CaInitOptions {
        dir,
        name,
        permitted_dns,
        validity_days: validity,
    };
    match egressd::commands::ca_init(&options) {
        Ok(made) => {
            println!(
                "wrote {} (the CA certificate: clients trust it)",
                made.cert_path.display()
            );
            println!(
                "wrote {} (its key, mode 0600: for egressd only)",
                made.key_path.display()
            );
            println!("SHA-256 fingerprint: {}", made.fingerprint);
            println!(
                "trust it, e.g.: curl --cacert {} --proxy http://EGRESSD:PORT https://HOST/",
                made.cert_path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("egressd ca init: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A byte count: a plain number or a Kubernetes quantity (`512Ki`, `1Mi`).
fn parse_size(s: &str) -> Result<u64, String> {
    s.parse::<egressd::config::units::Quantity>()
        .map(u64::from)
        .map_err(|e| e.to_string())
}

/// `check --probe` on a single-threaded runtime: probes are I/O-bound and few.
fn check_probe(paths: &[PathBuf], hosts: &[String]) -> ExitCode {
    let runtime = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let report = runtime.block_on(egressd::probe::probe(paths, hosts));
    print!("{}", report.text);
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A current-thread runtime, or the exit code after saying why there is none.
fn current_thread_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("egressd: cannot start: {e}");
            ExitCode::FAILURE
        })
}

fn init_logging(level: Option<&str>) {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{reload, EnvFilter};
    let initial = match level {
        Some(l) => l.to_owned(),
        None => std::env::var("RUST_LOG")
            .ok()
            .filter(|v| EnvFilter::try_new(v).is_ok())
            .unwrap_or_else(|| "info".to_owned()),
    };
    let filter = EnvFilter::try_new(&initial).unwrap_or_else(|_| EnvFilter::new("info"));
    // The filter sits behind a reload handle: admin `/logging` changes it at run time.
    let (filter, handle) = reload::Layer::new(filter);
    // Colour codes only on a terminal: log collectors get plain text.
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    tracing_subscriber::registry().with(filter).with(fmt).init();
    egressd::telemetry::log_level::install(
        &initial,
        Box::new(move |directive| {
            let parsed = EnvFilter::try_new(directive)
                .map_err(|e| format!("`{directive}` is not a log filter: {e}"))?;
            handle
                .reload(parsed)
                .map_err(|e| format!("cannot change the log filter: {e}"))
        }),
    );
}

/// The control runtime: reloads, DNS, admin and signals. Traffic runs on the workers.
fn run(options: Options, admin_address_file: Option<PathBuf>) -> ExitCode {
    let runtime = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let (mut hup, mut term, mut int) = match (
            signal(SignalKind::hangup()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(h), Ok(t), Ok(i)) => (h, t, i),
            _ => {
                eprintln!("egressd: cannot install signal handlers");
                return ExitCode::FAILURE;
            }
        };
        let proxy = match Proxy::start(options).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("egressd: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(path) = admin_address_file {
            let addr = proxy
                .admin_addr()
                .await
                .map(|a| a.to_string())
                .unwrap_or_default();
            // Written to a temporary name and renamed, so readers never see a partial file.
            let tmp = path.with_extension("tmp");
            if let Err(e) = std::fs::write(&tmp, &addr).and_then(|()| std::fs::rename(&tmp, &path))
            {
                eprintln!("egressd: cannot write {}: {e}", path.display());
            }
        }
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading");
                    let _ = proxy.reload().await;
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        tracing::info!("draining");
        let clean = proxy.shutdown().await;
        tracing::info!(clean, "stopped");
        ExitCode::SUCCESS
    })
}
