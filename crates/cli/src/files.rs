//! Reading inputs (a path or `-` for stdin) and writing outputs atomically (temp file + rename),
//! so a crash never leaves a half-written calibration or pool file behind.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};

/// The whole text of `path`, or of stdin when `path` is `-`.
pub fn read_text(path: &Path) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading stdin")?;
        return Ok(text);
    }
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes `contents` to `path` atomically: a temporary file in the same directory, synced,
/// then renamed over the target.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> Result<()> {
        let mut f =
            fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(contents)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))
    };
    let result = write();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_the_file_and_leave_no_temporary_behind() {
        let dir = std::env::temp_dir().join(format!("specfit-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.json")]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writing_into_a_missing_directory_fails_cleanly() {
        let path = Path::new("/nonexistent-specfit-dir/x.json");
        let e = write_atomic(path, b"x").unwrap_err().to_string();
        assert!(e.contains("/nonexistent-specfit-dir"), "{e}");
    }
}
