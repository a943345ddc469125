//! The clustermesh config directory on a real directory, with the watcher actor running.

#![allow(missing_docs)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use actix::{Actor, Addr, Context, Handler};
use meshwork_clustermesh::config_dir::{
    ClusterConfigEvent, ConfigDirError, ConfigDirWatcher, ScannedFile, scan_dir,
};
use tokio::sync::mpsc;

/// How long a test waits for an expected event before failing.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

const LOCAL: &str = "local";

fn config(host: &str) -> String {
    format!("endpoints:\n- https://{host}:2379\n")
}

/// The test's recipient: forwards every event into a channel.
struct Collector(mpsc::UnboundedSender<ClusterConfigEvent>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<ClusterConfigEvent> for Collector {
    type Result = ();

    fn handle(&mut self, event: ClusterConfigEvent, _ctx: &mut Self::Context) {
        let _ = self.0.send(event);
    }
}

struct Running {
    events: mpsc::UnboundedReceiver<ClusterConfigEvent>,
    _watcher: Addr<ConfigDirWatcher>,
}

impl Running {
    /// The initial read, then the actor, as the agent does it.
    fn start(dir: &Path) -> (Vec<ClusterConfigEvent>, Self) {
        let (state, initial) = ConfigDirWatcher::read_initial(dir, LOCAL).unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let collector = Collector(tx).start();
        let watcher = ConfigDirWatcher::new(state, collector.recipient()).start();
        let running = Self {
            events,
            _watcher: watcher,
        };
        (initial, running)
    }

    /// Waits until the watch is live: every event comes from a rescan, and the first rescan
    /// runs after `started` set up the watch. Later changes can then only be seen through
    /// `notify`, not through that first rescan.
    async fn sync(&mut self, dir: &Path) {
        fs::write(dir.join("sync"), config("sync")).unwrap();
        assert_eq!(self.next_upsert("sync").await, endpoints("sync"));
    }

    async fn next(&mut self) -> ClusterConfigEvent {
        tokio::time::timeout(EVENT_TIMEOUT, self.events.recv())
            .await
            .expect("no config event in time")
            .expect("collector gone")
    }

    async fn next_upsert(&mut self, name: &str) -> Vec<String> {
        match self.next().await {
            ClusterConfigEvent::Upsert { name: got, config } if got == name => {
                config.etcd.endpoints
            }
            other => panic!("expected an upsert of {name}, got {other:?}"),
        }
    }
}

fn endpoints(host: &str) -> Vec<String> {
    vec![format!("https://{host}:2379")]
}

#[actix_rt::test]
async fn create_modify_rewrite_remove() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("c1"), config("c1")).unwrap();
    fs::write(dir.path().join(LOCAL), config("me")).unwrap();
    fs::write(dir.path().join("README"), "not a cluster\n").unwrap();

    let (initial, mut running) = Running::start(dir.path());
    assert_eq!(initial.len(), 1, "{initial:?}");
    assert_eq!(initial[0].name(), "c1");
    running.sync(dir.path()).await;

    fs::write(dir.path().join("c2"), config("c2")).unwrap();
    assert_eq!(running.next_upsert("c2").await, endpoints("c2"));

    fs::write(dir.path().join("c1"), config("c1-new")).unwrap();
    assert_eq!(running.next_upsert("c1").await, endpoints("c1-new"));

    // An identical rewrite is no event: the next one is for the file written after it.
    fs::write(dir.path().join("c1"), config("c1-new")).unwrap();
    fs::write(dir.path().join(LOCAL), config("me-new")).unwrap();
    fs::write(dir.path().join("c3"), config("c3")).unwrap();
    assert_eq!(running.next_upsert("c3").await, endpoints("c3"));

    fs::remove_file(dir.path().join("c2")).unwrap();
    assert_eq!(
        running.next().await,
        ClusterConfigEvent::Remove { name: "c2".into() }
    );
}

#[actix_rt::test]
async fn invalid_file_then_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let (initial, mut running) = Running::start(dir.path());
    assert!(initial.is_empty());
    running.sync(dir.path()).await;

    fs::write(dir.path().join("c1"), "endpoints: [\"not a url\"]\n").unwrap();
    match running.next().await {
        ClusterConfigEvent::Invalid { name, error } => {
            assert_eq!(name, "c1");
            let file = dir.path().join("c1");
            assert!(
                error.starts_with(&format!("{}: ", file.display())),
                "{error}"
            );
            assert!(error.contains("not a valid URL"), "{error}");
        }
        other => panic!("{other:?}"),
    }

    fs::write(dir.path().join("c1"), config("c1")).unwrap();
    assert_eq!(running.next_upsert("c1").await, endpoints("c1"));
}

/// The layout kubelet gives a secret volume, and its update: a new timestamped directory,
/// `..data` swapped to it by rename, new keys linked, the old directory and keys removed.
#[actix_rt::test]
async fn kubernetes_data_symlink_swap() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let publish = |generation: &str, files: &[(&str, String)]| {
        let data = root.join(generation);
        fs::create_dir(&data).unwrap();
        for (name, content) in files {
            fs::write(data.join(name), content).unwrap();
        }
        symlink(generation, root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    };
    publish("..2024_01_01_00_00_00.1", &[("c5", config("c5-a"))]);
    symlink("..data/c5", root.join("c5")).unwrap();

    let (initial, mut running) = Running::start(root);
    assert_eq!(initial.len(), 1, "{initial:?}");
    assert_eq!(initial[0].name(), "c5");
    running.sync(root).await;

    // New content for c5.
    publish("..2024_01_01_00_00_00.2", &[("c5", config("c5-b"))]);
    fs::remove_dir_all(root.join("..2024_01_01_00_00_00.1")).unwrap();
    assert_eq!(running.next_upsert("c5").await, endpoints("c5-b"));

    // A new key: only c6 is reported, c5 did not change.
    publish(
        "..2024_01_01_00_00_00.3",
        &[("c5", config("c5-b")), ("c6", config("c6"))],
    );
    symlink("..data/c6", root.join("c6")).unwrap();
    fs::remove_dir_all(root.join("..2024_01_01_00_00_00.2")).unwrap();
    assert_eq!(running.next_upsert("c6").await, endpoints("c6"));

    // A key removed: its link dangles, then goes.
    publish("..2024_01_01_00_00_00.4", &[("c6", config("c6"))]);
    fs::remove_dir_all(root.join("..2024_01_01_00_00_00.3")).unwrap();
    fs::remove_file(root.join("c5")).unwrap();
    assert_eq!(
        running.next().await,
        ClusterConfigEvent::Remove { name: "c5".into() }
    );
}

/// A link to a file outside the directory: an edit there is seen (the target is watched).
#[actix_rt::test]
async fn symlink_target_outside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("c7.yaml");
    fs::write(&target, config("c7-a")).unwrap();
    symlink(&target, dir.path().join("c7")).unwrap();

    let (initial, mut running) = Running::start(dir.path());
    assert_eq!(initial.len(), 1, "{initial:?}");
    running.sync(dir.path()).await;

    fs::write(&target, config("c7-b")).unwrap();
    assert_eq!(running.next_upsert("c7").await, endpoints("c7-b"));
}

#[actix_rt::test]
async fn missing_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("clustermesh");
    let err = ConfigDirWatcher::read_initial(&missing, LOCAL).unwrap_err();
    assert!(matches!(err, ConfigDirError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("does not exist"), "{err}");

    let file = dir.path().join("file");
    fs::write(&file, "").unwrap();
    let err = ConfigDirWatcher::read_initial(&file, LOCAL).unwrap_err();
    assert!(
        matches!(err, ConfigDirError::NotADirectory { .. }),
        "{err:?}"
    );
}

#[test]
fn scan_keeps_regular_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join("c1"), config("c1")).unwrap();
    fs::write(root.join(".hidden"), config("hidden")).unwrap();
    fs::create_dir(root.join("subdir")).unwrap();
    symlink("c1", root.join("link-to-c1")).unwrap();
    symlink("nowhere", root.join("dangling")).unwrap();
    symlink("loop", root.join("loop")).unwrap();
    // Opening a FIFO would block the scan: it must be skipped without being opened.
    let status = std::process::Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(status.success());

    let files = scan_dir(root).unwrap();
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(names, ["c1", "link-to-c1", "loop"]);
    assert_eq!(files["link-to-c1"], files["c1"]);
    assert!(
        matches!(&files["loop"], ScannedFile::Unreadable(e) if e.contains("symbolic links")),
        "{:?}",
        files["loop"]
    );
}
