//! A seal: what a fetcher hashed while it wrote a version's files, so that
//! the verify stage need not read them again.
//!
//! A remote source hashes every byte as it arrives and writes it once into
//! baton's own cache. Hashing the written files again would be a second
//! full pass over the version for nothing. So the fetcher records, for each
//! file it wrote, the digest it computed and the file's stamp (device,
//! inode, size, modification and change time) taken after the last write.
//! The verify stage opens each file as always; where the file's stamp is
//! still the sealed one, the sealed digest stands for the file's, and the
//! file is not read. Any write since, by anyone, moves the change time (the
//! kernel sets it; no user can set it back), so a file touched after the
//! fetch is hashed as any other. A seal that cannot be read is ignored: the
//! version is then verified by reading every file.
//!
//! A seal holds only within the boot it was written in: the fetcher does not
//! wait for its bytes to reach the disk, and after a crash of the machine a
//! file may keep its stamp but lose its last pages. After a reboot, sealed
//! files are hashed again (once; not downloaded again).
//!
//! ```text
//! baton-seal 1 <boot id>
//! <sha256> <size> <dev> <ino> <mtime s> <mtime ns> <ctime s> <ctime ns> <path>
//! end 1
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::files::verified::Stamp;

const HEADER: &str = "baton-seal 1";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id, or empty where the kernel does not say.
fn boot_id() -> String {
    std::fs::read_to_string(BOOT_ID).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// One file a fetcher wrote and hashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealEntry {
    /// Path relative to the version directory, `/`-separated.
    pub path: String,
    /// Lower-case hex SHA-256 of the bytes written.
    pub sha256: String,
    pub(crate) stamp: Stamp,
}

impl SealEntry {
    /// The file's size when sealed.
    pub fn size(&self) -> u64 {
        self.stamp.size
    }
}

/// The files a fetcher wrote into a version directory, with their digests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seal {
    boot: String,
    entries: Vec<SealEntry>,
}

impl Seal {
    /// An empty seal, of this boot.
    pub fn new() -> Seal {
        Seal { boot: boot_id(), entries: Vec::new() }
    }

    /// Records `file`, written at `path` with `sha256`, as it is now. Call it
    /// after the last write to the file.
    pub fn record(&mut self, path: &str, file: &File, sha256: &str) -> std::io::Result<()> {
        let stamp = Stamp::of(&file.metadata()?);
        self.entries.retain(|e| e.path != path);
        self.entries.push(SealEntry { path: path.to_owned(), sha256: sha256.to_owned(), stamp });
        Ok(())
    }

    /// The digest sealed for `path`, if the file's stamp is still the one
    /// sealed.
    pub(crate) fn digest_of(&self, path: &str, now: &Stamp) -> Option<&str> {
        if self.boot.is_empty() || self.boot != boot_id() {
            return None;
        }
        self.entries.iter().find(|e| e.path == path && &e.stamp == now).map(|e| e.sha256.as_str())
    }

    /// Every entry.
    pub fn entries(&self) -> &[SealEntry] {
        &self.entries
    }

    /// Writes the seal to `path` through a temporary file and a rename, so
    /// that a reader sees the whole seal or none.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut text = format!("{HEADER} {}\n", self.boot);
        for e in &self.entries {
            let s = &e.stamp;
            text.push_str(&format!(
                "{} {} {} {} {} {} {} {} {}\n",
                e.sha256, s.size, s.dev, s.ino, s.mtime.0, s.mtime.1, s.ctime.0, s.ctime.1, e.path
            ));
        }
        text.push_str(&format!("end {}\n", self.entries.len()));
        let tmp = path.with_extension("seal-tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Reads a seal; `None` if there is none or it is not a whole seal.
    pub fn read(path: &Path) -> Option<Seal> {
        Seal::parse(&std::fs::read_to_string(path).ok()?)
    }

    fn parse(text: &str) -> Option<Seal> {
        let mut lines = text.lines();
        let boot = lines.next()?.strip_prefix(HEADER)?.strip_prefix(' ')?.to_owned();
        let mut entries = Vec::new();
        for line in lines {
            if let Some(count) = line.strip_prefix("end ") {
                return (count.parse::<usize>().ok()? == entries.len()).then_some(Seal { boot, entries });
            }
            let mut fields = line.splitn(9, ' ');
            let mut next = || fields.next();
            let sha256 = next()?.to_owned();
            let mut number = || -> Option<i64> { next()?.parse().ok() };
            let (size, dev, ino) = (number()?, number()?, number()?);
            let (mtime, ctime) = ((number()?, number()?), (number()?, number()?));
            let path = fields.next()?.to_owned();
            let unsigned = |n: i64| u64::try_from(n).ok();
            let stamp = Stamp { dev: unsigned(dev)?, ino: unsigned(ino)?, size: unsigned(size)?, mtime, ctime };
            entries.push(SealEntry { path, sha256, stamp });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_reads_back_and_a_cut_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let file_path = dir.path().join("w.bin");
        std::fs::write(&file_path, b"weights").unwrap();
        let mut seal = Seal::new();
        seal.record("w.bin", &File::open(&file_path).unwrap(), "ab").unwrap();
        seal.record("sub dir/x y", &File::open(&file_path).unwrap(), "cd").unwrap();
        let path = dir.path().join("1.seal");
        seal.write(&path).unwrap();
        assert_eq!(Seal::read(&path), Some(seal.clone()));
        let stamp = Stamp::of(&std::fs::metadata(&file_path).unwrap());
        assert_eq!(seal.digest_of("w.bin", &stamp), Some("ab"));
        assert_eq!(seal.digest_of("sub dir/x y", &stamp), Some("cd"), "a path with spaces");
        let other_boot = Seal { boot: "another boot".into(), ..seal.clone() };
        assert_eq!(other_boot.digest_of("w.bin", &stamp), None, "a seal of another boot");

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.rfind("end").unwrap()]).unwrap();
        assert_eq!(Seal::read(&path), None, "no closing line");
        std::fs::write(&path, text.replace("end 2", "end 3")).unwrap();
        assert_eq!(Seal::read(&path), None, "a count that disagrees");
        assert_eq!(Seal::read(&dir.path().join("absent")), None);
    }

    #[test]
    fn a_write_after_sealing_unseals_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file_path = dir.path().join("w.bin");
        std::fs::write(&file_path, b"weights").unwrap();
        let mut seal = Seal::new();
        seal.record("w.bin", &File::open(&file_path).unwrap(), "ab").unwrap();
        std::fs::write(&file_path, b"weightz").unwrap();
        let stamp = Stamp::of(&std::fs::metadata(&file_path).unwrap());
        assert_eq!(seal.digest_of("w.bin", &stamp), None);
    }
}
