//! The fence's token encodings sort as the tokens do (a seeded random sweep and every pair of
//! edge values), read back to the same token, and refuse what is not one; and the in-memory
//! fence passes the scenarios every store passes.

use crate::fence;

use std::cmp::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zklock::fence::{Fence, MemoryFence, Outcome, SORTABLE_BYTES_LEN, SORTABLE_STRING_LEN};
use zklock::FencingToken;

use fence::Subject;

const EDGE_ZXIDS: &[i64] = &[
    i64::MIN,
    i64::MIN + 1,
    -(1 << 53) - 1,
    -(1 << 32),
    -1,
    0,
    1,
    0xffff_ffff,
    0x1_0000_0000,
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    i64::MAX - 1,
    i64::MAX,
];
const EDGE_LOCALS: &[u32] = &[0, 1, 9, 10, 0xffff, u32::MAX - 1, u32::MAX];

fn edge_tokens() -> Vec<FencingToken> {
    EDGE_ZXIDS
        .iter()
        .flat_map(|&z| EDGE_LOCALS.iter().map(move |&l| FencingToken::new(z, l)))
        .collect()
}

fn random_token(rng: &mut StdRng) -> FencingToken {
    // Mostly near each other (equal zxids, neighbouring locals), sometimes anywhere.
    let zxid = match rng.gen_range(0..4) {
        0 => rng.gen(),
        1 => rng.gen_range(-3..3),
        2 => (1i64 << 53) + rng.gen_range(-2..3),
        _ => 0x5_0000_0000 + rng.gen_range(0..4),
    };
    let local = match rng.gen_range(0..3) {
        0 => rng.gen(),
        _ => rng.gen_range(0..3),
    };
    FencingToken::new(zxid, local)
}

fn check_pair(a: FencingToken, b: FencingToken) {
    let want: Ordering = a.cmp(&b);
    assert_eq!(
        a.to_sortable_bytes().cmp(&b.to_sortable_bytes()),
        want,
        "bytes of {a:?} vs {b:?}"
    );
    assert_eq!(
        a.to_sortable_string().cmp(&b.to_sortable_string()),
        want,
        "strings of {a:?} vs {b:?}"
    );
}

fn check_round_trip(t: FencingToken) {
    let bytes = t.to_sortable_bytes();
    assert_eq!(bytes.len(), SORTABLE_BYTES_LEN);
    assert_eq!(FencingToken::from_sortable_bytes(&bytes).unwrap(), t);
    let s = t.to_sortable_string();
    assert_eq!(s.len(), SORTABLE_STRING_LEN, "{s}");
    assert!(s.bytes().all(|b| b.is_ascii_digit()), "{s}");
    assert_eq!(FencingToken::parse_sortable(&s).unwrap(), t);
}

#[test]
fn every_pair_of_edge_tokens_sorts_the_same_encoded() {
    let tokens = edge_tokens();
    for &a in &tokens {
        check_round_trip(a);
        for &b in &tokens {
            check_pair(a, b);
        }
    }
}

#[test]
fn random_tokens_sort_the_same_encoded() {
    let mut rng = StdRng::seed_from_u64(0x5eed_f00d);
    for _ in 0..200_000 {
        let (a, b) = (random_token(&mut rng), random_token(&mut rng));
        check_round_trip(a);
        check_pair(a, b);
    }
}

#[test]
fn what_is_no_encoded_token_is_refused() {
    for s in [
        "",
        "4294967301",
        "4294967301.1",
        "09223372041149743109000000000",   // 29 digits
        "0922337204114974310900000000011", // 31 digits
        "0922337204114974310900000000-1",
        "18446744073709551616000000000", // above u64::MAX (29 digits)
        "184467440737095516160000000000", // above u64::MAX
        "000000000000000000004294967296", // local above u32::MAX
        "٠٩٢٢٣٣٧٢٠٤١١٤٩٧٤٣١٠٩٠٠٠٠٠٠٠٠٠٠", // digits, but not ASCII
    ] {
        let err = FencingToken::parse_sortable(s).expect_err(s);
        assert!(err.to_string().contains("30 decimal digits"), "{err}");
    }
    for bytes in [&[][..], &[0u8; 11][..], &[0u8; 13][..]] {
        assert!(FencingToken::from_sortable_bytes(bytes).is_err());
    }
}

/// The in-memory fence, with a log kept beside it.
#[derive(Clone, Default)]
struct Memory {
    fence: MemoryFence<String>,
    log: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

impl Subject for Memory {
    async fn another(&self) -> Self {
        self.clone()
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        let outcome = self
            .fence
            .fenced_write(resource, token, value.to_string())
            .await
            .unwrap();
        if outcome.is_accepted() {
            // Not atomic with the write, but writes through one MemoryFence are serialized
            // by its map, and the log is only read once every writer finished.
            self.log
                .lock()
                .unwrap()
                .push((resource.to_string(), value.to_string()));
        }
        outcome
    }

    async fn value(&self, resource: &str) -> Option<String> {
        self.fence.value(resource)
    }

    async fn log(&self, resource: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        self.fence.last_token(resource).await.unwrap()
    }
}

#[tokio::test]
async fn the_memory_fence_refuses_older_tokens_and_accepts_newer_and_equal() {
    fence::older_refused_newer_accepted(&Memory::default(), "sku_1").await;
}

#[tokio::test]
async fn the_memory_fence_fences_tokens_of_local_handoffs() {
    let m = Memory::default();
    let manager = zklock::LockManager::in_memory();
    let tokens = fence::local_handoffs(&manager, "sku_5", |guard| {
        let m = &m;
        async move {
            let outcome = guard
                .fenced(&m.fence)
                .write(guard.fencing_token().to_string())
                .await
                .unwrap();
            assert!(outcome.is_accepted());
            (guard.fencing_token(), guard)
        }
    })
    .await;
    let resource = manager.path_of("sku_5").unwrap();
    assert_eq!(m.fence.value(&resource), Some(tokens[2].to_string()));
}
