//! The shard file COMMAND reads (`generation N`, then `INDEX FENCING_TOKEN` per held shard) and
//! the acknowledgement it writes.

use std::{collections::BTreeMap, path::Path};

/// The shard file: `generation N`, then `INDEX FENCING_TOKEN` per held shard.
pub(super) fn render(generation: u64, set: &BTreeMap<u32, u64>) -> String {
    let mut s = format!("generation {generation}\n");
    for (index, token) in set {
        s.push_str(&format!("{index} {token}\n"));
    }
    s
}

/// Writes `text` to `path` atomically: a reader sees the old or the new file, never a part.
pub(super) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The generation COMMAND acknowledged (0: none).
pub(super) fn read_ack(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The held shards as `0,3,7`.
pub(super) fn list(set: &BTreeMap<u32, u64>) -> String {
    set.keys().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_the_generation_then_each_shard_with_its_token() {
        let set = BTreeMap::from([(0, 17), (3, 42)]);
        assert_eq!(render(5, &set), "generation 5\n0 17\n3 42\n");
        assert_eq!(list(&set), "0,3");
        assert_eq!(render(1, &BTreeMap::new()), "generation 1\n");
    }

    #[test]
    fn files_are_replaced_whole_and_acks_read() {
        let dir = std::env::temp_dir().join(format!("kl-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.shards");
        write_atomically(&f, "generation 1\n").unwrap();
        write_atomically(&f, "generation 2\n0 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "generation 2\n0 1\n");
        let ack = f.with_extension("ack");
        assert_eq!(read_ack(&ack), 0);
        std::fs::write(&ack, "7\n").unwrap();
        assert_eq!(read_ack(&ack), 7);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
