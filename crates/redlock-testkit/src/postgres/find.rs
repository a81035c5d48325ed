//! Finding PostgreSQL's server binaries, `initdb` and `postgres`.
//!
//! Debian does not put them on `PATH`: they live in `/usr/lib/postgresql/<major>/bin`, and
//! `/usr/bin` only holds the client wrappers of postgresql-common. So the search goes, first
//! directory holding both wins:
//! 1. `$REDLOCK_PG_BIN`, a directory; when set, nothing else is tried, so a wrong value is an
//!    error rather than a silent fall-back to another version;
//! 2. the directory of `initdb` on `PATH`, with symlinks resolved (a `/usr/local/bin/initdb`
//!    link leads to the real directory, where `postgres` sits next to it);
//! 3. `pg_config --bindir` (libpq-dev's `pg_config` may belong to a newer libpq than the
//!    server, hence the check that both binaries are really there);
//! 4. `/usr/lib/postgresql/*/bin`, the highest major version first.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::HarnessError;

/// Environment variable naming the directory that holds `initdb` and `postgres`.
pub const PG_BIN_ENV: &str = "REDLOCK_PG_BIN";

/// Where Debian installs one directory of server binaries per major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The two server binaries the harness runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PgBin {
    pub(crate) initdb: PathBuf,
    pub(crate) postgres: PathBuf,
}

/// Locates the server binaries (see the module docs for the order).
pub(crate) fn find_pg_bin() -> Result<PgBin, HarnessError> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV).filter(|v| !v.is_empty()) {
        return in_dir(Path::new(&dir)).ok_or_else(|| HarnessError::PostgresNotFound {
            detail: format!("{PG_BIN_ENV}={dir:?} does not hold executable initdb and postgres"),
        });
    }
    let path_var = std::env::var_os("PATH");
    let candidates = on_path(path_var.as_deref())
        .into_iter()
        .chain(pg_config_bindir())
        .chain(versioned_dirs(Path::new(DEBIAN_ROOT)));
    first_complete(candidates).ok_or_else(|| HarnessError::PostgresNotFound {
        detail: format!(
            "no initdb on PATH, `pg_config --bindir` gave none and no {DEBIAN_ROOT}/*/bin holds \
             both initdb and postgres, and {PG_BIN_ENV} is not set"
        ),
    })
}

/// The first directory holding both binaries.
fn first_complete(dirs: impl IntoIterator<Item = PathBuf>) -> Option<PgBin> {
    dirs.into_iter().find_map(|dir| in_dir(&dir))
}

fn in_dir(dir: &Path) -> Option<PgBin> {
    let bin = PgBin {
        initdb: dir.join("initdb"),
        postgres: dir.join("postgres"),
    };
    (crate::process::is_executable(&bin.initdb) && crate::process::is_executable(&bin.postgres))
        .then_some(bin)
}

/// The real directory of the first `initdb` on `path_var`.
fn on_path(path_var: Option<&OsStr>) -> Option<PathBuf> {
    let initdb = path_var
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("initdb"))
        .find(|p| crate::process::is_executable(p))?;
    let real = initdb.canonicalize().unwrap_or(initdb);
    real.parent().map(Path::to_owned)
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let dir = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(dir.trim()))
}

/// `root/<version>/bin` for every numeric version directory, the highest version first.
fn versioned_dirs(root: &Path) -> Vec<PathBuf> {
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            // "15", or "9.6" for the old numbering.
            let version = name
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()
                .ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn fake_bin(dir: &Path, names: &[&str]) {
        fs::create_dir_all(dir).unwrap();
        for name in names {
            let p = dir.join(name);
            fs::write(&p, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn highest_numeric_version_first() {
        let root = tempfile::tempdir().unwrap();
        for v in ["9.6", "13", "15", "not-a-version"] {
            fs::create_dir_all(root.path().join(v).join("bin")).unwrap();
        }
        let dirs = versioned_dirs(root.path());
        let names: Vec<_> = dirs
            .iter()
            .map(|d| d.parent().unwrap().file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["15", "13", "9.6"]);
    }

    #[test]
    fn a_directory_needs_both_binaries() {
        let root = tempfile::tempdir().unwrap();
        let only_initdb = root.path().join("a");
        let both = root.path().join("b");
        fake_bin(&only_initdb, &["initdb"]);
        fake_bin(&both, &["initdb", "postgres"]);
        let found = first_complete([root.path().join("missing"), only_initdb, both.clone()]);
        assert_eq!(found.unwrap().postgres, both.join("postgres"));
    }

    #[test]
    fn initdb_on_path_is_followed_through_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("lib/15/bin");
        fake_bin(&real, &["initdb", "postgres"]);
        let links = root.path().join("local-bin");
        fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(real.join("initdb"), links.join("initdb")).unwrap();
        let dir = on_path(Some(links.as_os_str())).unwrap();
        assert_eq!(dir, real.canonicalize().unwrap());
        assert!(in_dir(&dir).is_some());
    }

    #[test]
    fn missing_binaries_say_how_to_install() {
        let err = HarnessError::PostgresNotFound {
            detail: "nothing".into(),
        }
        .to_string();
        assert!(err.contains("apt-get install -y postgresql"), "{err}");
        assert!(err.contains(PG_BIN_ENV), "{err}");
    }
}
