use super::*;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::sync::Weak;
use tokio::time::timeout;

use super::driver::emit;
use super::filter::{is_config_file_name, DATA_LINK};
use super::watch_set::dir_identity;

const DEBOUNCE: Duration = Duration::from_millis(50);
const DEADLINE: Duration = Duration::from_secs(5);

fn events_only() -> WatchOptions {
    WatchOptions {
        debounce: DEBOUNCE,
        poll_interval: None,
    }
}

async fn next(rx: &mut mpsc::Receiver<ReloadCause>) -> ReloadCause {
    timeout(DEADLINE, rx.recv())
        .await
        .expect("no reload trigger before the deadline")
        .expect("trigger channel closed")
}

async fn next_paths(rx: &mut mpsc::Receiver<ReloadCause>) -> Vec<PathBuf> {
    match next(rx).await {
        ReloadCause::FileChange { paths } => paths,
        other => panic!("expected a file change, got {other:?}"),
    }
}

async fn assert_quiet(rx: &mut mpsc::Receiver<ReloadCause>, debounce: Duration) {
    let res = timeout(debounce * 3, rx.recv()).await;
    assert!(res.is_err(), "unexpected trigger: {res:?}");
}

fn write_replace(path: &Path, content: &str) {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    fs::write(&tmp, content).unwrap();
    fs::rename(&tmp, path).unwrap();
}

#[cfg(unix)]
fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// Builds a Kubernetes AtomicWriter-style volume: `..<ts>/<key>`, `..data -> ..<ts>`,
/// `<key> -> ..data/<key>`.
#[cfg(unix)]
fn atomic_writer_init(dir: &Path, ts: &str, key: &str, content: &str) {
    let data = dir.join(format!("..{ts}"));
    fs::create_dir(&data).unwrap();
    fs::write(data.join(key), content).unwrap();
    symlink(format!("..{ts}"), dir.join(DATA_LINK));
    symlink(format!("{DATA_LINK}/{key}"), dir.join(key));
}

/// The AtomicWriter update: new timestamped dir, `..data_tmp` renamed over `..data`,
/// old dir removed.
#[cfg(unix)]
fn atomic_writer_swap(dir: &Path, old_ts: &str, new_ts: &str, key: &str, content: &str) {
    let data = dir.join(format!("..{new_ts}"));
    fs::create_dir(&data).unwrap();
    fs::write(data.join(key), content).unwrap();
    symlink(format!("..{new_ts}"), dir.join("..data_tmp"));
    fs::rename(dir.join("..data_tmp"), dir.join(DATA_LINK)).unwrap();
    fs::remove_dir_all(dir.join(format!("..{old_ts}"))).unwrap();
}

#[test]
fn config_file_names() {
    for yes in ["a.yaml", "a.yml", "B.YAML", "x.y.yml"] {
        assert!(is_config_file_name(OsStr::new(yes)), "{yes}");
    }
    for no in [
        "a.yaml.tmp",
        ".a.yaml.swp",
        ".hidden.yaml",
        "..data",
        "yaml",
        "a.json",
        "4913",
    ] {
        assert!(!is_config_file_name(OsStr::new(no)), "{no}");
    }
}

#[test]
fn fingerprint_ignores_extra_set_changes() {
    let stamp = |len| {
        Some(Stamp {
            len,
            modified: None,
            inode: 1,
        })
    };
    let mut base = Fingerprint::default();
    base.extras.insert(PathBuf::from("/a"), stamp(1));
    let mut now = Fingerprint::default();
    now.extras.insert(PathBuf::from("/b"), stamp(2));
    assert!(base.absorb(now.clone()).is_empty());
    now.extras.insert(PathBuf::from("/a"), stamp(3));
    assert_eq!(base.absorb(now), vec![PathBuf::from("/a")]);
}

#[test]
fn start_outside_runtime_is_an_error() {
    let res = ConfigWatcher::start(vec![], events_only());
    assert!(matches!(res, Err(WatchError::NoRuntime)));
}

#[test]
fn watcher_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ConfigWatcher>();
}

#[tokio::test]
async fn in_place_edit_triggers_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    fs::write(&file, "a: 1\n").unwrap();
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    fs::write(&file, "a: 2\n").unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![file]);
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn reading_config_does_not_trigger() {
    // The reload reads the files it was told about; that must not loop.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    fs::write(&file, "a: 1\n").unwrap();
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    assert_eq!(fs::read_to_string(&file).unwrap(), "a: 1\n");
    let _ = fs::read_dir(dir.path()).unwrap().count();
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn temp_file_rename_triggers() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.yaml");
    fs::write(&file, "a: 1\n").unwrap();
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    write_replace(&file, "a: 2\n");
    assert_eq!(next_paths(&mut rx).await, vec![file]);
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn create_and_delete_each_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.yml");
    fs::write(&old, "a: 1\n").unwrap();
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    let new = dir.path().join("new.yaml");
    fs::write(&new, "b: 1\n").unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![new]);

    fs::remove_file(&old).unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![old]);
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn burst_of_writes_coalesces() {
    // A longer debounce than elsewhere so a slow CI machine still fits 20 writes in it.
    let debounce = Duration::from_millis(200);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    fs::write(&file, "n: 0\n").unwrap();
    let opts = WatchOptions {
        debounce,
        poll_interval: None,
    };
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();

    for i in 1..=20 {
        fs::write(&file, format!("n: {i}\n")).unwrap();
    }
    assert_eq!(next_paths(&mut rx).await, vec![file]);
    assert_quiet(&mut rx, debounce).await;
}

#[test]
fn pending_trigger_covers_later_changes() {
    // Capacity 1: while a trigger is unread, later ones are folded into it, never
    // waited on; only a dropped receiver stops the driver.
    let (tx, mut rx) = mpsc::channel(1);
    assert!(emit(&tx, ReloadCause::Poll));
    let second = ReloadCause::FileChange { paths: vec![] };
    assert!(emit(&tx, second));
    assert_eq!(rx.try_recv(), Ok(ReloadCause::Poll));
    assert!(rx.try_recv().is_err());
    drop(rx);
    assert!(!emit(&tx, ReloadCause::Poll));
}

#[cfg(unix)]
#[tokio::test]
async fn configmap_data_swap_triggers_once() {
    let dir = tempfile::tempdir().unwrap();
    atomic_writer_init(dir.path(), "2026_11_22_04_00_00.123", "app.yaml", "v: 1\n");
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    atomic_writer_swap(
        dir.path(),
        "2026_11_22_04_00_00.123",
        "2026_11_22_04_05_00.456",
        "app.yaml",
        "v: 2\n",
    );
    assert_eq!(next_paths(&mut rx).await, vec![dir.path().join(DATA_LINK)]);
    let seen = fs::read_to_string(dir.path().join("app.yaml")).unwrap();
    assert_eq!(seen, "v: 2\n");
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn extra_file_in_other_dir() {
    let cfg = tempfile::tempdir().unwrap();
    fs::write(cfg.path().join("app.yaml"), "a: 1\n").unwrap();
    let certs = tempfile::tempdir().unwrap();
    let cert = certs.path().join("cert.pem");
    let unrelated = certs.path().join("notes.yaml");
    fs::write(&cert, "old").unwrap();
    fs::write(&unrelated, "x").unwrap();
    let (w, mut rx) = ConfigWatcher::start(vec![cfg.path().into()], events_only()).unwrap();
    w.set_extra_files(vec![cert.clone()]);

    fs::write(&unrelated, "y").unwrap();
    write_replace(&unrelated, "z");
    assert_quiet(&mut rx, DEBOUNCE).await;

    write_replace(&cert, "new");
    assert_eq!(next_paths(&mut rx).await, vec![cert.clone()]);

    // No longer referenced: no longer watched.
    w.set_extra_files(vec![]);
    fs::write(&cert, "newer").unwrap();
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[cfg(unix)]
#[tokio::test]
async fn extra_file_in_secret_volume_swap() {
    let cfg = tempfile::tempdir().unwrap();
    let secret = tempfile::tempdir().unwrap();
    atomic_writer_init(secret.path(), "ts1", "tls.crt", "cert 1");
    let cert = secret.path().join("tls.crt");
    let (w, mut rx) = ConfigWatcher::start(vec![cfg.path().into()], events_only()).unwrap();
    w.set_extra_files(vec![cert.clone()]);

    atomic_writer_swap(secret.path(), "ts1", "ts2", "tls.crt", "cert 2");
    let paths = next_paths(&mut rx).await;
    assert!(paths.contains(&secret.path().join(DATA_LINK)), "{paths:?}");
    assert_eq!(fs::read_to_string(&cert).unwrap(), "cert 2");
    assert_quiet(&mut rx, DEBOUNCE).await;

    // The watch on the symlink's target directory followed the swap.
    w.set_extra_files(vec![cert.clone()]);
    write_replace(&secret.path().join("..ts2/tls.crt"), "cert 2b");
    let paths = next_paths(&mut rx).await;
    assert!(
        paths.contains(&secret.path().join("..ts2/tls.crt")),
        "{paths:?}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn same_directory_under_two_names() {
    // inotify has one watch per inode and notify reports it under one name; both
    // spellings must still match.
    let base = tempfile::tempdir().unwrap();
    let real = base.path().join("real");
    fs::create_dir(&real).unwrap();
    let link = base.path().join("link");
    symlink(&real, &link);
    fs::write(real.join("app.yaml"), "a: 1\n").unwrap();
    fs::write(real.join("ca.pem"), "ca").unwrap();
    let (w, mut rx) = ConfigWatcher::start(vec![link.clone()], events_only()).unwrap();
    w.set_extra_files(vec![real.join("ca.pem")]);

    fs::write(link.join("app.yaml"), "a: 2\n").unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![link.join("app.yaml")]);
    write_replace(&real.join("ca.pem"), "ca 2");
    let paths = next_paths(&mut rx).await;
    assert!(paths.contains(&real.join("ca.pem")), "{paths:?}");
}

#[tokio::test]
async fn poll_sees_dir_that_appears_later() {
    let base = tempfile::tempdir().unwrap();
    let cfg = base.path().join("cfg");
    let opts = WatchOptions {
        debounce: DEBOUNCE,
        poll_interval: Some(Duration::from_millis(100)),
    };
    let (_w, mut rx) = ConfigWatcher::start(vec![cfg.clone()], opts).unwrap();

    // Populate elsewhere and move into place, so no inotify watch can see the file.
    let staging = base.path().join("staging");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("app.yaml"), "a: 1\n").unwrap();
    fs::rename(&staging, &cfg).unwrap();
    assert_eq!(next(&mut rx).await, ReloadCause::Poll);
}

#[tokio::test]
async fn deleted_and_recreated_dir_is_watched_again() {
    let base = tempfile::tempdir().unwrap();
    let cfg = base.path().join("cfg");
    fs::create_dir(&cfg).unwrap();
    fs::write(cfg.join("app.yaml"), "a: 1\n").unwrap();
    let (w, mut rx) = ConfigWatcher::start(vec![cfg.clone()], events_only()).unwrap();

    fs::remove_dir_all(&cfg).unwrap();
    let paths = next_paths(&mut rx).await;
    assert!(paths.contains(&cfg.join("app.yaml")), "{paths:?}");

    let staging = base.path().join("staging");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("app.yaml"), "a: 2\n").unwrap();
    fs::rename(&staging, &cfg).unwrap();
    // What the poll tick does (polling is off here to keep the causes deterministic).
    let _ = w.shared.maintain(false);
    assert_eq!(
        lock(&w.shared.watches).active.get(&cfg),
        dir_identity(&cfg).as_ref(),
    );

    fs::write(cfg.join("app.yaml"), "a: 3\n").unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![cfg.join("app.yaml")]);
}

#[tokio::test]
async fn constant_changes_still_reload() {
    // Without the 10x cap a directory rewritten every few ms would never go quiet.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    fs::write(&file, "n: 0\n").unwrap();
    let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, file) = (Arc::clone(&stop), file.clone());
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let mut n = 0u64;
            // Paces the writes (faster than the debounce); not used for synchronisation.
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(10)
            {
                n += 1;
                fs::write(&file, format!("n: {n}\n")).unwrap();
                std::thread::sleep(DEBOUNCE / 5);
            }
        })
    };
    let res = timeout(Duration::from_secs(3), rx.recv()).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        matches!(res, Ok(Some(ReloadCause::FileChange { .. }))),
        "{res:?}"
    );
}

#[tokio::test]
async fn poll_does_not_repeat_event_triggers() {
    let poll = Duration::from_millis(40);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    fs::write(&file, "a: 1\n").unwrap();
    let certs = tempfile::tempdir().unwrap();
    let cert = certs.path().join("cert.pem");
    fs::write(&cert, "c").unwrap();
    let opts = WatchOptions {
        debounce: DEBOUNCE,
        poll_interval: Some(poll),
    };
    let (w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();

    // A new extra-file set is not a change by itself.
    w.set_extra_files(vec![cert.clone()]);
    assert_quiet(&mut rx, DEBOUNCE).await;

    // The event trigger refreshes the poll baseline, so no Poll follows it.
    fs::write(&file, "a: 2\n").unwrap();
    assert_eq!(next_paths(&mut rx).await, vec![file]);
    assert_quiet(&mut rx, DEBOUNCE).await;
}

#[tokio::test]
async fn drop_ends_receiver_and_releases_everything() {
    let dir = tempfile::tempdir().unwrap();
    let opts = WatchOptions {
        debounce: DEBOUNCE,
        poll_interval: Some(Duration::from_millis(20)),
    };
    let (w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();
    let shared: Weak<Shared> = Arc::downgrade(&w.shared);
    drop(w);

    let end = timeout(DEADLINE, rx.recv())
        .await
        .expect("receiver not closed");
    assert_eq!(end, None);
    // The driver dropped its handle before the sender, so the notify watcher is gone.
    assert!(shared.upgrade().is_none());
}
