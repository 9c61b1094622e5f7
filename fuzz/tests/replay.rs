//! The fuzz targets as stable tests: the generated corpora replayed, then
//! a seeded random-mutation loop. `AIRLOCK_FUZZ_ITERATIONS=N` runs longer;
//! `AIRLOCK_FUZZ_SEED=S` picks another seed; `AIRLOCK_FUZZ_WRITE_CORPUS=DIR`
//! writes the seeds for cargo-fuzz (`fuzz/corpus`).

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

#[test]
fn corpora_can_be_written_for_cargo_fuzz() {
    let Some(dir) = std::env::var_os("AIRLOCK_FUZZ_WRITE_CORPUS") else {
        return;
    };
    airlock_fuzz::write_corpora(std::path::Path::new(&dir)).unwrap();
}
