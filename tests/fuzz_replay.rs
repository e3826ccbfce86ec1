//! The fuzz targets' bodies (`tollgate::fuzzing`) on the committed seeds (`fuzz/seeds/<target>/`)
//! and minimized failing inputs (`fuzz/regressions/<target>/`, when a run found one), plus
//! deterministic mutations of each seed: `make test` runs every target's body without the
//! nightly toolchain, so a change that breaks one fails here the day it lands. Also holds the
//! fuzz crate to the bodies: one target file per body, each calling its body, each listed in
//! `fuzz/Cargo.toml`, each with seeds.

use std::path::{Path, PathBuf};

use tollgate::fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir`, sorted (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn every_fuzz_target_is_a_body_the_suite_runs() {
    let cargo = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let on_disk: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let named: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        {
            let mut v = on_disk.clone();
            v.sort();
            v
        },
        {
            let mut v: Vec<String> = named.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        },
        "fuzz/fuzz_targets/ and tollgate::fuzzing::TARGETS name the same targets"
    );
    for name in named {
        let src =
            std::fs::read_to_string(fuzz_dir().join(format!("fuzz_targets/{name}.rs"))).unwrap();
        assert!(
            src.contains(&format!("tollgate::fuzzing::{name}(data)")),
            "fuzz_targets/{name}.rs does not call tollgate::fuzzing::{name}"
        );
        assert!(
            cargo.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        assert!(
            !files(&fuzz_dir().join(format!("seeds/{name}"))).is_empty(),
            "fuzz/seeds/{name}/ is empty: a target starts from its seeds"
        );
    }
}

/// A small deterministic generator (xorshift), so a failure names an input that comes back.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `seed` with a few bytes changed, inserted or cut (the moves a fuzzer makes first).
fn mutate(seed: &[u8], rng: &mut Xorshift) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.next() % 4 {
        let at = if v.is_empty() {
            0
        } else {
            (rng.next() as usize) % v.len()
        };
        match rng.next() % 4 {
            0 if !v.is_empty() => v[at] ^= 1 << (rng.next() % 8),
            1 => v.insert(at, rng.next() as u8),
            2 if !v.is_empty() => {
                v.remove(at);
            }
            _ => {
                let special = [0u8, 0xFF, b'{', b'}', b'|', b'%', b':', b'\n', b'"', b'*'];
                if !v.is_empty() {
                    v[at] = special[(rng.next() as usize) % special.len()];
                }
            }
        }
    }
    v
}

#[test]
fn the_seeds_and_their_mutations_pass_every_body() {
    let mut rng = Xorshift(0x9E37_79B9_7F4A_7C15);
    for (name, body) in TARGETS {
        let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
        for dir in ["seeds", "regressions"] {
            for p in files(&fuzz_dir().join(dir).join(name)) {
                inputs.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
        let seeds = inputs.clone();
        for (from, seed) in &seeds {
            for i in 0..300 {
                inputs.push((format!("{from}, mutation {i}"), mutate(seed, &mut rng)));
            }
        }
        inputs.push(("empty".into(), Vec::new()));
        for (what, data) in &inputs {
            let ran = std::panic::catch_unwind(|| body(data));
            assert!(ran.is_ok(), "{name} failed on {what}: {data:?}");
        }
        eprintln!("{name}: {} inputs ({} seeds)", inputs.len(), seeds.len());
    }
}
