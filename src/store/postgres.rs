//! kine over PostgreSQL: one kine per slot, all on one database (docs/background.md section 7: the old and
//! the new slot each dial their own kine, so a slot's kine stops with the slot and a kine restart
//! never takes both slots down).
//!
//! kcpshard talks to PostgreSQL itself (tokio-postgres) to create the database when it is missing
//! and to tell the user PostgreSQL's own error when it cannot be reached. The password comes from a
//! file or an environment variable named in the spec; it reaches kine and pg_dump as PGPASSWORD in
//! their environment, never in argv (which every local user can read), status, events or logs.
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::{KinePostgresStore, PasswordSource, SslMode};
use crate::process::UnitName;

use super::kine::{self, KineSpec, READY_TIMEOUT};
use super::{StoreError, postgres_tls};

/// How long one connection attempt to PostgreSQL may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A password; Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// Reads a password from where `source` says. A trailing newline in a file is not part of it.
pub fn read_password(source: &PasswordSource) -> Result<Password, StoreError> {
    let field = "spec.store.kinePostgres.passwordFrom";
    match (&source.file, &source.env) {
        (Some(file), None) => {
            let text = std::fs::read_to_string(file).map_err(|e| {
                StoreError::Invalid(format!(
                    "cannot read the PostgreSQL password from {field}.file {file}: {e}; create it (mode 0600) or fix the path"
                ))
            })?;
            Ok(Password(text.trim_end_matches(['\n', '\r']).to_string()))
        }
        (None, Some(var)) => std::env::var(var).map(Password).map_err(|_| {
            StoreError::Invalid(format!(
                "the environment variable {var} named by {field}.env is not set for kcpshard serve; set it where serve starts, or use {field}.file"
            ))
        }),
        _ => Err(StoreError::Invalid(format!("{field} needs exactly one of file or env"))),
    }
}

/// Where the shard's database is and how to log in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresServer {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub password: Option<Password>,
    pub ssl_mode: SslMode,
    /// The CA that verifies the server (libpq's sslrootcert); else the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl PostgresServer {
    /// The server the spec names, with the password read now.
    pub fn from_spec(spec: &KinePostgresStore) -> Result<PostgresServer, StoreError> {
        Ok(PostgresServer {
            host: spec.host.clone(),
            port: spec.port,
            database: spec.database.clone(),
            user: spec.user.clone(),
            password: spec.password_from.as_ref().map(read_password).transpose()?,
            ssl_mode: spec.ssl_mode,
            ca_file: spec.ca_file.as_ref().map(PathBuf::from),
        })
    }

    /// `host:port/database`, for messages.
    pub fn describe(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.database)
    }

    /// kine's `--endpoint`: no password (kine reads PGPASSWORD, as libpq and pgx do), the CA file as
    /// sslrootcert, and an application_name that makes each slot's kine endpoint unique (it finds
    /// the kine by its argv; PostgreSQL shows it in pg_stat_activity).
    pub fn kine_endpoint(&self, application: &str) -> String {
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let root_cert = match &self.ca_file {
            Some(file) => format!("&sslrootcert={}", enc(&file.display().to_string())),
            None => String::new(),
        };
        format!(
            "postgres://{}@{host}:{}/{}?sslmode={}{root_cert}&application_name={}",
            enc(&self.user),
            self.port,
            enc(&self.database),
            self.ssl_mode.as_str(),
            enc(application),
        )
    }

    /// The environment kine and pg_dump need: the password, if there is one.
    pub fn env(&self) -> Vec<(String, String)> {
        self.password
            .iter()
            .map(|p| ("PGPASSWORD".to_string(), p.expose().to_string()))
            .collect()
    }

    /// The kine of one slot: its own directory and socket, on the shared database.
    pub fn slot_kine(&self, binary: &Path, dir: PathBuf, application: &str, unit: UnitName) -> KineSpec {
        KineSpec {
            unit,
            binary: binary.to_path_buf(),
            endpoint: self.kine_endpoint(application),
            dir,
            env: self.env(),
            ready_timeout: READY_TIMEOUT,
        }
    }

    async fn connect(&self, database: &str) -> Result<tokio_postgres::Client, StoreError> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(database)
            .application_name("kcpshard")
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(password) = &self.password {
            config.password(password.expose());
        }
        let failed = |mut message: String| {
            if message.contains("not valid for name") {
                message.push_str(&format!(
                    "; sslMode verify-full checks that the certificate names host {}: write in spec.store.kinePostgres.host a name or address it has, or use sslMode verify-ca to check its CA only",
                    self.host
                ));
            } else if message.contains("invalid peer certificate") {
                message.push_str(&format!(
                    "; sslMode {} verifies PostgreSQL's certificate: set spec.store.kinePostgres.caFile to the CA that signed it, or use sslMode require to encrypt without verifying it",
                    self.ssl_mode.as_str()
                ));
            }
            StoreError::Postgres {
                server: format!("{}:{}/{database}", self.host, self.port),
                message,
            }
        };
        let client = match self.ssl_mode {
            SslMode::Disable => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, connection) = connect_within(config.connect(tokio_postgres::NoTls))
                    .await
                    .map_err(failed)?;
                tokio::spawn(connection);
                client
            }
            mode => {
                // TLS is required; what of the certificate is verified follows the sslmode as kine
                // applies it (postgres_tls).
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let tls = postgres_tls::connector(mode, self.ca_file.as_deref())?;
                let (client, connection) = connect_within(config.connect(tls)).await.map_err(failed)?;
                tokio::spawn(connection);
                client
            }
        };
        Ok(client)
    }

    /// Connects to the shard's database and runs `SELECT 1`: PostgreSQL's own error when it fails.
    pub async fn check(&self) -> Result<(), StoreError> {
        let client = self.connect(&self.database).await?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(|e| StoreError::Postgres {
                server: self.describe(),
                message: postgres_message(&e),
            })?;
        Ok(())
    }

    /// Creates the shard's database if it is missing (connected to the `postgres` database).
    /// Returns whether it created it.
    pub async fn ensure_database(&self) -> Result<bool, StoreError> {
        let client = self.connect("postgres").await?;
        let failed = |e: tokio_postgres::Error| StoreError::Postgres {
            server: self.describe(),
            message: postgres_message(&e),
        };
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&self.database])
            .await
            .map_err(failed)?
            .is_some();
        if exists {
            return Ok(false);
        }
        let quoted = quote(&self.database);
        client
            .batch_execute(&format!("CREATE DATABASE {quoted}"))
            .await
            .map_err(|e| StoreError::Postgres {
                server: self.describe(),
                message: format!(
                    "{}; create database {quoted} yourself, or grant user {} CREATEDB",
                    postgres_message(&e),
                    self.user
                ),
            })?;
        Ok(true)
    }
}

impl PostgresServer {
    /// Makes the kines over the shard's database (a kine made it, none runs on it now) hand out
    /// revisions above `above`, and take older ones as compacted ([`kine::RAISE_REVISION_SQL`]);
    /// the id sequence moves past it too.
    pub async fn raise_kine_revision(&self, above: i64) -> Result<(), StoreError> {
        let mut client = self.connect(&self.database).await?;
        let failed = |e: tokio_postgres::Error| StoreError::Postgres {
            server: self.describe(),
            message: format!("cannot raise kine's revision above {above}: {}", postgres_message(&e)),
        };
        let [fill, compact] = kine::RAISE_REVISION_SQL;
        let transaction = client.transaction().await.map_err(failed)?;
        transaction
            .execute(fill, &[&above, &format!("gap-{above}")])
            .await
            .map_err(failed)?;
        transaction.execute(compact, &[&above]).await.map_err(failed)?;
        transaction
            .execute("SELECT setval('kine_id_seq', $1)", &[&above])
            .await
            .map_err(failed)?;
        transaction.commit().await.map_err(failed)
    }
}

impl PostgresServer {
    /// Drops database `name` if it exists (closing its connections) and creates it empty: a
    /// scratch database for a preflight's copy. Never the shard's own database.
    pub async fn recreate_database(&self, name: &str) -> Result<(), StoreError> {
        self.drop_database(name).await?;
        self.admin_statement(&format!("CREATE DATABASE {}", quote(name))).await
    }

    /// Drops database `name` if it exists, closing its connections. Never the shard's own.
    pub async fn drop_database(&self, name: &str) -> Result<(), StoreError> {
        if name == self.database {
            return Err(StoreError::Invalid(format!(
                "refusing to drop {name}: it is the shard's own database"
            )));
        }
        self.admin_statement(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote(name)))
            .await
    }

    async fn admin_statement(&self, sql: &str) -> Result<(), StoreError> {
        let client = self.connect("postgres").await?;
        client.batch_execute(sql).await.map_err(|e| StoreError::Postgres {
            server: self.describe(),
            message: format!("{sql}: {}", postgres_message(&e)),
        })
    }
}

/// A database name as an SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The connection, or PostgreSQL's message. connect_timeout bounds each TCP connect; this bounds
/// the whole handshake as well (a server that accepts but never answers).
async fn connect_within<F, T>(connecting: F) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    match tokio::time::timeout(CONNECT_TIMEOUT * 2, connecting).await {
        Ok(result) => result.map_err(|e| postgres_message(&e)),
        Err(_) => Err(format!("no answer within {:?}", CONNECT_TIMEOUT * 2)),
    }
}

/// PostgreSQL's message: the server's own for an error it reported, else the client's chain
/// ("error connecting to server: Connection refused").
pub fn postgres_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> PostgresServer {
        PostgresServer {
            host: "127.0.0.1".into(),
            port: 5433,
            database: "kcp".into(),
            user: "kcp".into(),
            password: Some(Password("s3cret".into())),
            ssl_mode: SslMode::Disable,
            ca_file: None,
        }
    }

    #[test]
    fn the_kine_endpoint_never_holds_the_password_and_is_unique_per_slot() {
        let s = server();
        let a = s.kine_endpoint("kcpshard-dev-a");
        assert_eq!(
            a,
            "postgres://kcp@127.0.0.1:5433/kcp?sslmode=disable&application_name=kcpshard-dev-a"
        );
        assert_ne!(a, s.kine_endpoint("kcpshard-dev-b"));
        assert!(!a.contains("s3cret"));
        assert_eq!(s.env(), [("PGPASSWORD".to_string(), "s3cret".to_string())]);
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn the_ca_file_reaches_kine_as_sslrootcert() {
        let mut s = server();
        s.ssl_mode = SslMode::VerifyFull;
        s.ca_file = Some("/etc/kcpshard/pg ca.pem".into());
        assert_eq!(
            s.kine_endpoint("kcpshard-dev-a"),
            "postgres://kcp@127.0.0.1:5433/kcp?sslmode=verify-full&sslrootcert=%2Fetc%2Fkcpshard%2Fpg+ca.pem&application_name=kcpshard-dev-a"
        );
    }

    #[test]
    fn an_ipv6_host_is_bracketed() {
        let mut s = server();
        s.host = "::1".into();
        assert!(s.kine_endpoint("x").starts_with("postgres://kcp@[::1]:5433/"));
    }

    #[test]
    fn passwords_come_from_a_file_without_its_newline_or_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "hunter2\n").unwrap();
        let from_file = read_password(&PasswordSource {
            file: Some(file.display().to_string()),
            env: None,
        })
        .unwrap();
        assert_eq!(from_file.expose(), "hunter2");

        let missing = read_password(&PasswordSource {
            file: Some(dir.path().join("nope").display().to_string()),
            env: None,
        })
        .unwrap_err()
        .to_string();
        assert!(
            missing.contains("passwordFrom.file") && missing.contains("create it"),
            "{missing}"
        );

        let unset = read_password(&PasswordSource {
            file: None,
            env: Some("KCPSHARD_TEST_SURELY_UNSET_VARIABLE".into()),
        })
        .unwrap_err()
        .to_string();
        assert!(
            unset.contains("KCPSHARD_TEST_SURELY_UNSET_VARIABLE") && unset.contains("is not set"),
            "{unset}"
        );
    }
}
