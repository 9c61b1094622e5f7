//! The fuzz targets as stable tests: the generated corpora replayed, then
//! a seeded random-mutation loop, and the corpora written out as cargo-fuzz
//! reads them and replayed from disk. `AIRLOCK_FUZZ_ITERATIONS=N` runs
//! longer; `AIRLOCK_FUZZ_SEED=S` picks another seed;
//! `AIRLOCK_FUZZ_WRITE_CORPUS=DIR` keeps the written seeds in DIR
//! (`fuzz/corpus`) instead of a temporary directory.

use airlock_fuzz::{Rng, archive_corpus, extract, mutate, request, request_corpus};

fn iterations(default: usize) -> usize {
    std::env::var("AIRLOCK_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("AIRLOCK_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x00a1_710c)
}

#[test]
fn request_corpus_replays_without_panicking() {
    let corpus = request_corpus();
    assert!(corpus.len() > 20);
    // The valid request really is valid, so the corpus reaches past parsing.
    let valid = serde_json::to_vec(&airlock_fuzz::valid_request()).unwrap();
    airlock_executor::request::parse(&valid, None).unwrap();
    for input in &corpus {
        request(input);
    }
}

#[test]
fn random_requests_never_panic() {
    let corpus = request_corpus();
    let mut rng = Rng::new(seed());
    for i in 0..iterations(20_000) {
        let a = &corpus[rng.below(corpus.len())];
        let b = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, a, b);
        let result = std::panic::catch_unwind(|| request(&input));
        assert!(
            result.is_ok(),
            "iteration {i} (seed {}) panicked on {:?}",
            seed(),
            String::from_utf8_lossy(&input)
        );
    }
}

#[test]
fn archive_corpus_replays_safely() {
    let corpus = archive_corpus();
    assert!(corpus.len() > 30);
    for (i, input) in corpus.iter().enumerate() {
        if let Err(e) = extract(input) {
            panic!("archive seed {i}: {e}");
        }
    }
}

#[test]
fn random_archives_stay_inside_the_workspace() {
    let corpus = archive_corpus();
    let mut rng = Rng::new(seed() ^ 0x5eed);
    for i in 0..iterations(3000) {
        let a = &corpus[rng.below(corpus.len())];
        let b = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, a, b);
        match std::panic::catch_unwind(|| extract(&input)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("iteration {i} (seed {}): {e}", seed()),
            Err(_) => panic!("iteration {i} (seed {}) panicked", seed()),
        }
    }
}

/// Writes the seed corpora as cargo-fuzz reads them (one file per seed),
/// into a temporary directory, or into `AIRLOCK_FUZZ_WRITE_CORPUS` when set
/// (`fuzz/corpus`), then reads every file back: it holds its seed's exact
/// bytes, and replays from disk as the seed does.
#[test]
fn corpora_are_written_for_cargo_fuzz_and_replay_from_disk() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("AIRLOCK_FUZZ_WRITE_CORPUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| scratch.path().to_owned());
    airlock_fuzz::write_corpora(&dir).unwrap();
    for (target, corpus) in [("request", request_corpus()), ("extract", archive_corpus())] {
        for (i, seed) in corpus.iter().enumerate() {
            let path = dir.join(target).join(format!("seed-{i:03}"));
            let on_disk =
                std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(&on_disk, seed, "{} differs from its seed", path.display());
            if target == "request" {
                request(&on_disk);
            } else if let Err(e) = extract(&on_disk) {
                panic!("{}: {e}", path.display());
            }
        }
    }
}
