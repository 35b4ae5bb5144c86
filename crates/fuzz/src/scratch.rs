//! Scratch files for the targets whose product code reads paths (model directories, GGUF
//! files): one folder per thread under the system's temporary folder, so that the test
//! harness's threads and parallel fuzzing jobs never share a file. The files are rewritten on
//! every input, and a thread's folder is removed when the thread ends (the test harness runs
//! each test on a thread of its own; a process's main thread may leave its folder behind).

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

/// A thread's scratch folder, removed with the thread's locals.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

thread_local! {
    static DIR: OnceCell<Scratch> = const { OnceCell::new() };
}

/// This thread's scratch folder (made on first use).
fn dir() -> PathBuf {
    DIR.with(|d| {
        d.get_or_init(|| {
            let id = format!("{:?}", std::thread::current().id());
            let digits: String = id.chars().filter(char::is_ascii_digit).collect();
            let dir =
                std::env::temp_dir().join(format!("specfit-fuzz-{}-{digits}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("the temporary folder is writable");
            Scratch(dir)
        })
        .0
        .clone()
    })
}

/// Writes `files` (name, bytes) into a fresh subfolder `name` of this thread's scratch folder
/// and returns the subfolder; files of an earlier input not named again are removed.
pub fn folder(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let dir = dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the scratch folder is writable");
    for (file, bytes) in files {
        write(&dir.join(file), bytes);
    }
    dir
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("the scratch folder is writable");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_scratch_folder_is_gone_once_the_thread_ends() {
        let (folder, root) = std::thread::spawn(|| {
            let folder = folder("case", &[("a.bin", b"bytes")]);
            assert_eq!(std::fs::read(folder.join("a.bin")).unwrap(), b"bytes");
            (folder, dir())
        })
        .join()
        .unwrap();
        assert!(
            !folder.exists() && !root.exists(),
            "{} is left",
            root.display()
        );
    }
}
