//! Real etcd servers on 127.0.0.1, plain or with TLS, client-certificate auth and etcd users.
//!
//! Each server has its own directory and free ports. [`EtcdServer::stop`] and
//! [`EtcdServer::restart`] keep the data and ports, so tests can take a remote cluster away
//! and bring it back. The TLS variant makes a CA, a server certificate (SAN `IP:127.0.0.1`)
//! and one client certificate per etcd user with `openssl`; with client-cert auth the
//! certificate's CN is the etcd user, as in Cilium's remote-user model. The CA lives ten
//! years and the other certificates one, as real ones do, so that only a certificate a test
//! makes short-lived ([`EtcdTls::issue_client_valid`]) looks close to expiry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use tempfile::TempDir;

use crate::process::{self, LabProcess};
use crate::{LabError, Result, paths, wait};

/// How to start an etcd server.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// Serve TLS with client-certificate auth and enable etcd authentication (user `root`).
    pub tls: bool,
    /// `--max-txn-ops` (etcd's default is 128); bulk loads go faster with more.
    pub max_txn_ops: Option<u32>,
    /// A name for logs and the etcd member (defaults to `etcd`).
    pub name: Option<String>,
    /// Keep the data on tmpfs (`/dev/shm`), so fsync costs nothing: for benchmarks that
    /// measure Meshwork rather than the disk.
    pub data_in_memory: bool,
    /// `GOMAXPROCS` of the server. Several servers sharing a small machine with the process
    /// under test each spin idle Go threads looking for work, burning CPU the measured
    /// process needs; one processor each keeps a benchmark's servers out of its way.
    pub max_procs: Option<u32>,
    /// Create the server's directory under this one (e.g. a [`Ramfs`](crate::ramfs::Ramfs),
    /// for hundreds of servers) instead of the temp dir; overrides `data_in_memory`.
    pub data_parent: Option<PathBuf>,
}

/// A running etcd server; stopped and its directory removed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    process: Option<LabProcess>,
    name: String,
    client_port: u16,
    peer_port: u16,
    options: EtcdOptions,
    tls: Option<EtcdTls>,
    // Last, so the process is stopped before its directory goes.
    dir: TempDir,
}

/// Certificates of a TLS etcd server.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    dir: PathBuf,
    /// The CA that signed the server and client certificates.
    pub ca_file: PathBuf,
}

/// A client identity: certificate and key, whose CN is the etcd user.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// PEM certificate.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// What an etcd user may do under a key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const ROOT_USER: &str = "root";

impl EtcdServer {
    /// Starts a plain (no TLS) etcd server.
    pub fn start() -> Result<Self> {
        Self::start_with(EtcdOptions::default())
    }

    /// Starts an etcd server as `options` say. Ports are picked free; if one was taken
    /// between picking and binding, it retries with new ports.
    pub fn start_with(options: EtcdOptions) -> Result<Self> {
        let mut server = Self::prepare(options)?;
        server.start_retrying(3)?;
        Ok(server)
    }

    /// Starts one server per entry of `options`: all are launched first, then each is waited
    /// for, so hundreds start in seconds; one that fails to come up is retried alone with new
    /// ports.
    pub fn start_many(options: impl IntoIterator<Item = EtcdOptions>) -> Result<Vec<Self>> {
        let mut servers = Vec::new();
        for options in options {
            let mut server = Self::prepare(options)?;
            server.pick_ports()?;
            server.launch()?;
            servers.push(server);
        }
        for server in &mut servers {
            if let Err(err) = server.wait_healthy() {
                tracing::warn!(%err, name = %server.name, "etcd did not start; retrying alone");
                if let Some(mut process) = server.process.take() {
                    process.kill();
                }
                server.start_retrying(2)?;
            } else if server.tls.is_some() {
                server.enable_auth()?;
            }
        }
        Ok(servers)
    }

    /// A server not started yet: its directory and TLS material.
    fn prepare(options: EtcdOptions) -> Result<Self> {
        paths::find_program("etcd")?;
        paths::find_program("etcdctl")?;
        let mut builder = tempfile::Builder::new();
        builder.prefix("meshwork-etcd-");
        let dir = match &options.data_parent {
            Some(parent) => builder.tempdir_in(parent),
            None if options.data_in_memory && Path::new("/dev/shm").is_dir() => {
                builder.tempdir_in("/dev/shm")
            }
            None => builder.tempdir(),
        }
        .map_err(LabError::io("creating the etcd temp dir"))?;
        let tls = if options.tls {
            Some(EtcdTls::create(&dir.path().join("tls"))?)
        } else {
            None
        };
        Ok(Self {
            process: None,
            name: options.name.clone().unwrap_or_else(|| "etcd".to_owned()),
            client_port: 0,
            peer_port: 0,
            options,
            tls,
            dir,
        })
    }

    /// Starts on fresh ports, up to `attempts` times.
    fn start_retrying(&mut self, attempts: u32) -> Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.pick_ports()?;
            match self.spawn() {
                Ok(()) => break,
                Err(err) if attempt < attempts => {
                    tracing::warn!(%err, "etcd did not start; retrying with new ports");
                }
                Err(err) => return Err(err),
            }
        }
        if self.tls.is_some() {
            self.enable_auth()?;
        }
        Ok(())
    }

    fn pick_ports(&mut self) -> Result<()> {
        self.client_port = wait::free_port()?;
        self.peer_port = wait::free_port()?;
        let _ = std::fs::remove_dir_all(self.data_dir());
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The client URL, e.g. `http://127.0.0.1:23790`.
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.client_port)
    }

    /// The value of one of the server's Prometheus metrics (e.g.
    /// `etcd_debugging_mvcc_watcher_total`, the watchers etcd holds), read from `/metrics` on
    /// the client port (`None`: no such metric); plain servers only.
    pub fn metric(&self, name: &str) -> Result<Option<f64>> {
        use std::io::{Read as _, Write as _};
        let context = format!("reading the metrics of etcd {}", self.name);
        if self.tls.is_some() {
            return Err(LabError::CommandFailed {
                command: context,
                detail: "metrics are read from plain servers only".to_owned(),
            });
        }
        let mut body = String::new();
        std::net::TcpStream::connect(("127.0.0.1", self.client_port))
            .and_then(|mut stream| {
                stream.set_read_timeout(Some(READY_TIMEOUT))?;
                stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
                stream.read_to_string(&mut body)
            })
            .map_err(LabError::io(context))?;
        Ok(body.lines().find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name)
                .then(|| value.trim().parse().ok())
                .flatten()
        }))
    }

    /// The client port on 127.0.0.1.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The TLS material, when started with TLS.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// The server's directory (data, TLS material, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self) -> Result<()> {
        self.launch()?;
        self.wait_healthy()
    }

    /// Spawns the process on the ports picked, without waiting for it.
    fn launch(&mut self) -> Result<()> {
        let etcd = paths::find_program("etcd")?;
        let client_url = self.endpoint();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(etcd);
        command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("{}={peer_url}", self.name))
            .arg("--log-level")
            .arg("warn");
        if let Some(ops) = self.options.max_txn_ops {
            command.arg("--max-txn-ops").arg(ops.to_string());
        }
        if let Some(procs) = self.options.max_procs {
            command.env("GOMAXPROCS", procs.to_string());
        }
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(tls.dir.join("server.crt"))
                .arg("--key-file")
                .arg(tls.dir.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(&tls.ca_file)
                .arg("--client-cert-auth");
        }
        let log = self.dir.path().join("etcd.log");
        let process = LabProcess::spawn(&format!("etcd {}", self.name), command, &log)?;
        self.process = Some(process);
        Ok(())
    }

    fn wait_healthy(&mut self) -> Result<()> {
        let what = format!("etcd {} to become healthy", self.name);
        let health = wait::Wait::new(what)
            .timeout(READY_TIMEOUT)
            .until(|| self.health(), |health| !matches!(health, Ok(false)));
        match health {
            Ok(health) => health.map(drop),
            Err(LabError::Timeout { what, waited, last }) => {
                let tail = self
                    .process
                    .as_ref()
                    .map(LabProcess::log_tail)
                    .unwrap_or_default();
                Err(LabError::Timeout {
                    what: format!("{what}; log:\n{tail}"),
                    waited,
                    last,
                })
            }
            Err(other) => Err(other),
        }
    }

    /// Whether the server answers its health check; an error when it exited.
    fn health(&mut self) -> Result<bool> {
        if let Some(process) = self.process.as_mut() {
            process.check_running()?;
        }
        Ok(wait::port_open(self.client_port)
            && self
                .etcdctl(ROOT_USER)
                .args(["endpoint", "health", "--command-timeout=1s"])
                .output()
                .is_ok_and(|o| o.status.success()))
    }

    /// An `etcdctl` command (API v3) aimed at this server. With TLS it authenticates with the
    /// client certificate of `user` (see [`EtcdServer::add_user`]); without TLS `user` is
    /// ignored.
    pub fn etcdctl(&self, user: &str) -> Command {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoint());
        if let Some(tls) = &self.tls {
            let cert = tls.client(user);
            command
                .arg("--cacert")
                .arg(&tls.ca_file)
                .arg("--cert")
                .arg(cert.cert_file)
                .arg("--key")
                .arg(cert.key_file);
        }
        command
    }

    /// Runs `etcdctl` as root with `args` and returns its stdout.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        process::run(self.etcdctl(ROOT_USER).args(args))
    }

    fn enable_auth(&self) -> Result<()> {
        self.ctl(&["user", "add", ROOT_USER, "--new-user-password=meshwork-lab"])?;
        self.ctl(&["user", "grant-role", ROOT_USER, "root"])?;
        self.ctl(&["auth", "enable"])?;
        Ok(())
    }

    /// Adds an etcd user with `access` to keys under `prefix` and issues its client
    /// certificate (CN = `user`). Only for TLS servers.
    pub fn add_user(&self, user: &str, prefix: &str, access: Access) -> Result<ClientCert> {
        let Some(tls) = &self.tls else {
            return Err(LabError::CommandFailed {
                command: format!("add_user {user}"),
                detail: "etcd users need a TLS server (EtcdOptions::tls)".to_owned(),
            });
        };
        let cert = tls.issue_client(user)?;
        let role = format!("{user}-role");
        let permission = match access {
            Access::Read => "read",
            Access::ReadWrite => "readwrite",
        };
        self.ctl(&["role", "add", &role])?;
        self.ctl(&[
            "role",
            "grant-permission",
            &role,
            "--prefix=true",
            permission,
            prefix,
        ])?;
        self.ctl(&["user", "add", user, "--new-user-password=meshwork-lab"])?;
        self.ctl(&["user", "grant-role", user, &role])?;
        Ok(cert)
    }

    /// Stops the server (SIGTERM), keeping its data and ports for [`EtcdServer::restart`].
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(5));
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would; data and ports are kept.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts a stopped server again on the same ports and data.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    /// Whether the server process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(LabProcess::is_running)
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(LabProcess::pid)
    }
}

impl EtcdTls {
    /// A new CA in `dir`, with a server certificate for 127.0.0.1 and localhost
    /// ([`EtcdTls::server`]) and root's client certificate: TLS material for any lab server.
    pub fn create(dir: &Path) -> Result<Self> {
        Self::create_named(dir, "meshwork-lab-ca")
    }

    /// TLS material of another CA, named apart as two real CAs are: its CA is a wrong
    /// `trusted-ca-file` for any other lab server, its client certificates ones that no
    /// other lab server accepts.
    pub fn foreign(dir: &Path) -> Result<Self> {
        Self::create_named(dir, "meshwork-lab-foreign-ca")
    }

    fn create_named(dir: &Path, ca_name: &str) -> Result<Self> {
        paths::find_program("openssl")?;
        std::fs::create_dir_all(dir).map_err(LabError::io("creating the TLS dir"))?;
        let tls = Self {
            dir: dir.to_owned(),
            ca_file: dir.join("ca.crt"),
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            &format!("/CN={ca_name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &path_str(&dir.join("ca.key")),
            "-out",
            &path_str(&tls.ca_file),
        ])?;
        tls.issue(
            "server",
            "etcd-server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth",
        )?;
        // The lab's own etcdctl calls (health checks, user setup) authenticate as root.
        tls.issue_client(ROOT_USER)?;
        Ok(tls)
    }

    /// The server certificate (SAN 127.0.0.1 and localhost) and its key.
    pub fn server(&self) -> ClientCert {
        ClientCert {
            cert_file: self.dir.join("server.crt"),
            key_file: self.dir.join("server.key"),
        }
    }

    /// The client certificate issued for `user` (see [`EtcdServer::add_user`]).
    pub fn client(&self, user: &str) -> ClientCert {
        ClientCert {
            cert_file: self.dir.join(format!("client-{user}.crt")),
            key_file: self.dir.join(format!("client-{user}.key")),
        }
    }

    /// Issues a client certificate with CN = `user`, signed by this CA.
    pub fn issue_client(&self, user: &str) -> Result<ClientCert> {
        self.issue(
            &format!("client-{user}"),
            user,
            "extendedKeyUsage=clientAuth",
        )?;
        Ok(self.client(user))
    }

    /// Issues a client certificate with CN = `user`, signed by this CA and valid from
    /// `not_before` to `not_after` (whole seconds, UTC): an expired one, or one about to
    /// expire. Its files are apart from [`EtcdTls::client`]'s.
    pub fn issue_client_valid(
        &self,
        user: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<ClientCert> {
        let (from, until) = (asn1_time(not_before), asn1_time(not_after));
        let file = format!("client-{user}-{from}-{until}");
        self.request(&file, user, "extendedKeyUsage=clientAuth")?;
        // openssl 3.0's `x509 -req` only counts days from now; `ca` takes both dates, and
        // needs a database and a config naming it.
        let db = self.dir.join("ca-db");
        std::fs::create_dir_all(&db).map_err(LabError::io("creating the CA database"))?;
        let index = db.join("index.txt");
        if !index.exists() {
            std::fs::write(&index, "").map_err(LabError::io("creating the CA index"))?;
        }
        let config = db.join("ca.cnf");
        let db_path = path_str(&db);
        std::fs::write(
            &config,
            format!(
                "[ca]\ndefault_ca = lab\n[lab]\ndatabase = {db_path}/index.txt\n\
                 new_certs_dir = {db_path}\nserial = {db_path}/serial\ndefault_md = sha256\n\
                 policy = any\nunique_subject = no\n[any]\ncommonName = supplied\n"
            ),
        )
        .map_err(LabError::io("writing the CA config"))?;
        openssl(&[
            "ca",
            "-batch",
            "-config",
            &path_str(&config),
            "-cert",
            &path_str(&self.ca_file),
            "-keyfile",
            &path_str(&self.dir.join("ca.key")),
            "-in",
            &path_str(&self.dir.join(format!("{file}.csr"))),
            "-out",
            &path_str(&self.dir.join(format!("{file}.crt"))),
            "-extfile",
            &path_str(&self.dir.join(format!("{file}.ext"))),
            "-rand_serial",
            "-notext",
            "-startdate",
            &from,
            "-enddate",
            &until,
        ])?;
        Ok(ClientCert {
            cert_file: self.dir.join(format!("{file}.crt")),
            key_file: self.dir.join(format!("{file}.key")),
        })
    }

    /// Makes a certificate signed by a different CA: what a client with a wrong CA presents.
    pub fn foreign_ca(dir: &Path) -> Result<PathBuf> {
        Ok(Self::foreign(dir)?.ca_file)
    }

    fn issue(&self, file: &str, common_name: &str, extensions: &str) -> Result<()> {
        self.request(file, common_name, extensions)?;
        let csr = self.dir.join(format!("{file}.csr"));
        let crt = self.dir.join(format!("{file}.crt"));
        let ext = self.dir.join(format!("{file}.ext"));
        openssl(&[
            "x509",
            "-req",
            "-days",
            "365",
            "-in",
            &path_str(&csr),
            "-CA",
            &path_str(&self.ca_file),
            "-CAkey",
            &path_str(&self.dir.join("ca.key")),
            "-CAcreateserial",
            "-extfile",
            &path_str(&ext),
            "-out",
            &path_str(&crt),
        ])?;
        Ok(())
    }

    /// A new key and signing request for `common_name`, and the extensions to sign it with.
    fn request(&self, file: &str, common_name: &str, extensions: &str) -> Result<()> {
        let key = self.dir.join(format!("{file}.key"));
        let csr = self.dir.join(format!("{file}.csr"));
        let ext = self.dir.join(format!("{file}.ext"));
        let extensions = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n{extensions}\n"
        );
        std::fs::write(&ext, extensions).map_err(LabError::io("writing the cert extensions"))?;
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={common_name}"),
            "-keyout",
            &path_str(&key),
            "-out",
            &path_str(&csr),
        ])
    }
}

/// `time` as openssl's `YYYYMMDDHHMMSSZ` (UTC, whole seconds; times before 1970 as 1970).
fn asn1_time(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}{:02}{:02}{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

fn openssl(args: &[&str]) -> Result<()> {
    process::run(Command::new("openssl").args(args)).map(drop)
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asn1_times_are_utc_civil_dates() {
        let at = |secs| asn1_time(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "19700101000000Z");
        assert_eq!(at(951_782_400), "20000229000000Z");
        assert_eq!(at(1_800_000_000), "20270115080000Z");
        assert_eq!(
            asn1_time(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            "19700101000000Z"
        );
    }
}
