//! Encodings of a [`FencingToken`] that sort as the token sorts, for stores that compare bytes,
//! strings or numbers rather than Rust values.
//!
//! - bytes: 12 bytes, the zxid big-endian with its sign bit flipped (so that negative zxids
//!   sort below positive ones, as `i64` does), then `local` big-endian. For PostgreSQL's
//!   `bytea` (compared as bytes), ZooKeeper node data, any key-value store's binary values.
//! - string: 30 decimal digits, the same two numbers as unsigned decimals padded to 20 and 10
//!   digits. Digits only, so any collation and Lua's string `<` order equal-length strings as
//!   numbers; no double ever holds the token, so no precision is lost past 2^53.

use super::error::FenceError;
use crate::types::token::FencingToken;

/// The length of [`FencingToken::to_sortable_bytes`].
pub const SORTABLE_BYTES_LEN: usize = 12;

/// The length of [`FencingToken::to_sortable_string`].
pub const SORTABLE_STRING_LEN: usize = 30;

const SIGN: u64 = 1 << 63;

impl FencingToken {
    /// The token as 12 bytes whose byte order (`memcmp`, PostgreSQL's `bytea` comparison) is
    /// the token's order.
    ///
    /// ```
    /// use zklock_core::FencingToken;
    ///
    /// let older = FencingToken::new(-5, 9);
    /// let newer = FencingToken::new(3, 0);
    /// assert!(older.to_sortable_bytes() < newer.to_sortable_bytes());
    /// assert_eq!(FencingToken::from_sortable_bytes(&newer.to_sortable_bytes())?, newer);
    /// # Ok::<(), zklock_core::fence::FenceError>(())
    /// ```
    pub fn to_sortable_bytes(&self) -> [u8; SORTABLE_BYTES_LEN] {
        let mut out = [0u8; SORTABLE_BYTES_LEN];
        out[..8].copy_from_slice(&((self.grant() as u64) ^ SIGN).to_be_bytes());
        out[8..].copy_from_slice(&self.local().to_be_bytes());
        out
    }

    /// Reads back [`to_sortable_bytes`](Self::to_sortable_bytes).
    ///
    /// # Errors
    /// [`FenceError::Encoding`] when `bytes` is not 12 bytes long.
    ///
    /// ```
    /// use zklock_core::FencingToken;
    ///
    /// assert!(FencingToken::from_sortable_bytes(b"short").is_err());
    /// ```
    pub fn from_sortable_bytes(bytes: &[u8]) -> Result<FencingToken, FenceError> {
        let bytes: [u8; SORTABLE_BYTES_LEN] =
            bytes.try_into().map_err(|_| FenceError::Encoding {
                found: format!("{bytes:02x?}"),
                expected: "12 bytes (FencingToken::to_sortable_bytes)",
            })?;
        let zxid = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")) ^ SIGN;
        let local = u32::from_be_bytes(bytes[8..].try_into().expect("4 bytes"));
        Ok(FencingToken::new(zxid as i64, local))
    }

    /// The token as 30 decimal digits whose string order is the token's order.
    ///
    /// ```
    /// use zklock_core::FencingToken;
    ///
    /// let token = FencingToken::new(4294967301, 1);
    /// let s = token.to_sortable_string();
    /// assert_eq!(s, "092233720411497431090000000001");
    /// assert!(FencingToken::new(4294967301, 0).to_sortable_string() < s);
    /// assert_eq!(FencingToken::parse_sortable(&s)?, token);
    /// # Ok::<(), zklock_core::fence::FenceError>(())
    /// ```
    pub fn to_sortable_string(&self) -> String {
        format!("{:020}{:010}", (self.grant() as u64) ^ SIGN, self.local())
    }

    /// Reads back [`to_sortable_string`](Self::to_sortable_string).
    ///
    /// # Errors
    /// [`FenceError::Encoding`] when `s` is not 30 digits, or its parts are out of range.
    ///
    /// ```
    /// use zklock_core::FencingToken;
    ///
    /// assert!(FencingToken::parse_sortable("4294967301.1").is_err()); // the display form
    /// ```
    pub fn parse_sortable(s: &str) -> Result<FencingToken, FenceError> {
        let bad = || FenceError::Encoding {
            found: format!("{s:?}"),
            expected: "30 decimal digits (FencingToken::to_sortable_string)",
        };
        if s.len() != SORTABLE_STRING_LEN || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let zxid: u64 = s[..20].parse().map_err(|_| bad())?;
        let local: u32 = s[20..].parse().map_err(|_| bad())?;
        Ok(FencingToken::new((zxid ^ SIGN) as i64, local))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_round_trip() {
        for zxid in [i64::MIN, -1, 0, 1, i64::MAX] {
            for local in [0, 1, u32::MAX] {
                let t = FencingToken::new(zxid, local);
                assert_eq!(
                    FencingToken::from_sortable_bytes(&t.to_sortable_bytes()).unwrap(),
                    t
                );
                let s = t.to_sortable_string();
                assert_eq!(s.len(), SORTABLE_STRING_LEN);
                assert_eq!(FencingToken::parse_sortable(&s).unwrap(), t);
            }
        }
    }

    #[test]
    fn out_of_range_digits_are_refused() {
        // 20 digits above u64::MAX, and a local above u32::MAX.
        assert!(FencingToken::parse_sortable("999999999999999999990000000000").is_err());
        assert!(FencingToken::parse_sortable("000000000000000000009999999999").is_err());
        assert!(FencingToken::parse_sortable("+00000000000000000000000000001").is_err());
    }
}
