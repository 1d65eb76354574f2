//! Lock keys: untrusted input turned into a znode name that cannot leave the namespace.

use std::fmt;

use super::error::{Error, Result};

/// The longest key accepted, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 512;

/// A validated lock key and its encoded znode name.
///
/// Keys often come from requests, so they are treated as untrusted: a key is always one path
/// component under the manager's namespace. `/`, `%`, whitespace and every byte outside
/// `[A-Za-z0-9._:@=+,~-]` are percent-encoded; the keys `.` and `..` have their dots encoded;
/// empty keys, keys with control characters and keys over [`MAX_KEY_LEN`] bytes are refused.
/// The encoding is injective: two different keys never share a znode.
///
/// # Examples
///
/// ```
/// use zklock_core::Key;
///
/// assert_eq!(Key::new("user_42").unwrap().encoded(), "user_42");
/// assert_eq!(Key::new("../etc/passwd").unwrap().encoded(), "..%2Fetc%2Fpasswd");
/// assert_eq!(Key::new("..").unwrap().encoded(), "%2E%2E");
/// assert!(Key::new("bad\nkey").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    raw: String,
    encoded: String,
}

fn passes_through(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'_' | b'-' | b'.' | b':' | b'@' | b'=' | b'+' | b',' | b'~'
        )
}

fn refuse(key: &str, reason: &'static str) -> Error {
    let mut shown: String = key.chars().take(64).collect();
    if shown.len() < key.len() {
        shown.push('…');
    }
    Error::InvalidKey { key: shown, reason }
}

impl Key {
    /// Validates and encodes `key`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is empty, longer than [`MAX_KEY_LEN`] bytes, or
    /// contains a control character.
    ///
    /// ```
    /// use zklock_core::Key;
    /// let k = Key::new("sku/100 blue").unwrap();
    /// assert_eq!(k.as_str(), "sku/100 blue");
    /// assert_eq!(k.encoded(), "sku%2F100%20blue");
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Key> {
        let raw = key.into();
        if raw.is_empty() {
            return Err(refuse(
                &raw,
                "the key is empty; give a non-empty name such as \"order_42\"",
            ));
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(refuse(
                &raw,
                "the key is longer than 512 bytes; hash long keys before locking",
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(refuse(
                &raw,
                "the key contains a control character; strip or escape it first",
            ));
        }
        let all_dots = raw == "." || raw == "..";
        let mut encoded = String::with_capacity(raw.len());
        for &b in raw.as_bytes() {
            if passes_through(b) && !(all_dots && b == b'.') {
                encoded.push(b as char);
            } else {
                encoded.push('%');
                encoded.push(char::from(b"0123456789ABCDEF"[(b >> 4) as usize]));
                encoded.push(char::from(b"0123456789ABCDEF"[(b & 15) as usize]));
            }
        }
        Ok(Key { raw, encoded })
    }

    /// The key as the caller gave it.
    ///
    /// ```
    /// assert_eq!(zklock_core::Key::new("a b").unwrap().as_str(), "a b");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The key as one znode name (no `/`, never `.` or `..`).
    ///
    /// ```
    /// assert_eq!(zklock_core::Key::new("a/b").unwrap().encoded(), "a%2Fb");
    /// ```
    pub fn encoded(&self) -> &str {
        &self.encoded
    }

    /// Decodes a znode name made by [`Key::encoded`] back into the key, or `None` when the
    /// name is not such an encoding.
    ///
    /// ```
    /// use zklock_core::Key;
    /// let k = Key::new("x/../y").unwrap();
    /// assert_eq!(Key::decode(k.encoded()).as_deref(), Some("x/../y"));
    /// ```
    pub fn decode(encoded: &str) -> Option<String> {
        let bytes = encoded.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = encoded.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.raw)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// The longest namespace or raw lock path accepted, in bytes. A request must fit the server's
/// `jute.maxbuffer` (1 MiB by default) or the server drops the whole connection, every hold of
/// the session with it, on each try.
pub(crate) const MAX_PATH_LEN: usize = 4096;

/// Checks an absolute znode path given by configuration or by `--path` (trusted more than a
/// key, but still checked): absolute, at most [`MAX_PATH_LEN`] bytes, no empty, `.` or `..`
/// components, no trailing `/`, no control characters, not the root and not under `/zookeeper`.
pub(crate) fn validate_path(path: &str, what: &str) -> Result<()> {
    if path.len() > MAX_PATH_LEN {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes long, over the {MAX_PATH_LEN} bytes a lock path may have",
            path.len()
        )));
    }
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "{what} {path:?} is not a usable znode path: {why}"
        )))
    };
    if !path.starts_with('/') {
        return bad("it must start with '/'");
    }
    if path == "/" {
        return bad("it must not be the root");
    }
    if path.ends_with('/') {
        return bad("it must not end with '/'");
    }
    if path.chars().any(|c| {
        c.is_control()
            || ('\u{e000}'..='\u{f8ff}').contains(&c)
            || ('\u{fff0}'..='\u{ffff}').contains(&c)
    }) {
        return bad("it contains a control or reserved character");
    }
    for part in path[1..].split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return bad("it has an empty, '.' or '..' component");
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return bad("/zookeeper is reserved for the server");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_stays_one_component() {
        for k in [
            "a",
            ".",
            "..",
            "...",
            "a/b",
            "%2F",
            "/",
            "ü",
            "a b",
            "_c_x-lock-1",
            "x%y",
            "🔒",
        ] {
            let key = Key::new(k).unwrap();
            assert!(!key.encoded().contains('/'), "{k}");
            assert_ne!(key.encoded(), ".");
            assert_ne!(key.encoded(), "..");
            assert_eq!(Key::decode(key.encoded()).unwrap(), k);
        }
    }

    #[test]
    fn distinct_keys_distinct_names() {
        let a = Key::new("a/b").unwrap();
        let b = Key::new("a%2Fb").unwrap();
        assert_ne!(a.encoded(), b.encoded());
    }

    #[test]
    fn refuses_bad_keys() {
        assert!(Key::new("").is_err());
        assert!(Key::new("a\0b").is_err());
        assert!(Key::new("a\u{7f}").is_err());
        assert!(Key::new("x".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(Key::new("x".repeat(MAX_KEY_LEN)).is_ok());
    }

    #[test]
    fn paths() {
        assert!(validate_path("/zklock/locks", "ns").is_ok());
        for p in [
            "zklock",
            "/",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/..",
            "/zookeeper/x",
            "/a\nb",
        ] {
            assert!(validate_path(p, "ns").is_err(), "{p}");
        }
    }
}
