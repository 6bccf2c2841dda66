//! Request path normalisation (`ProxyConfig.spec.downstream.paths`), before anything matches
//! the path and before it is forwarded, so that egressd routes the path the upstream will
//! serve: `/public/../admin` must not match `PathPrefix /public` and then reach the upstream,
//! which resolves it to `/admin` (Envoy's CVE-2019-9901, CVE-2021-31920).
//!
//! In order, as Envoy applies `path_with_escaped_slashes_action`, `normalize_path` and
//! `merge_slashes`:
//!
//! 1. Percent-encodings: a `%` must start `%XY` with two hex digits (RFC 3986 §2.1), else the
//!    path is refused: a stray `%` is how a double encoding (`%%32%65` → `%2e`) slips a dot past
//!    one decoding into the next. Encoded unreserved characters are decoded (`%2e` → `.`,
//!    `%41` → `A`), the others' hex digits upper-cased (`%2f` → `%2F`): RFC 3986 §6.2.2.1-2.
//! 2. Encoded slashes (`%2F`, `%5C`) and backslashes, which some servers take for `/`:
//!    kept, refused, or turned into `/` (`escapedSlashes`). Kept, they separate nothing here,
//!    so a segment in which they would hide a `.` or `..` (`..%2Fadmin`) is refused: a server
//!    that decodes them first would climb out of the prefix egressd matched.
//! 3. Dot-segments removed (RFC 3986 §5.2.4); a `..` above the root is refused rather than
//!    dropped, since a path that tries it is no honest request.
//! 4. With `mergeSlashes`, `//` becomes `/` (not RFC 3986; Envoy's `merge_slashes`).
//!
//! A path that needs none of it (no `%`, no `\`, no `.` or `..` segment, no `//` when merging)
//! costs one scan and no allocation.

pub(crate) use crate::snapshot::{EscapedSlashes, PathRules};

/// Why a path was refused (400 `invalid_path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathRejection {
    #[error("the path climbs above the root with `..` (RFC 3986 §5.2.4)")]
    AboveRoot,
    #[error("a `%` in the path starts no percent-encoding (RFC 3986 §2.1)")]
    BadPercent,
    #[error("the path has an encoded slash (%2F, %5C) or a backslash (downstream.paths.escapedSlashes: RejectRequest)")]
    EscapedSlash,
    #[error("an encoded slash (%2F, %5C) or a backslash in the path hides a `.` or `..` segment")]
    HiddenDotSegment,
}

/// The path `path` stands for under `rules`: `None` when it is already normal (the common case),
/// else the normal form. `path` is an origin-form path (it starts with `/`), without the query.
pub(crate) fn normalize(path: &str, rules: &PathRules) -> Result<Option<String>, PathRejection> {
    if !needs_work(path.as_bytes(), rules) {
        return Ok(None);
    }
    let decoded = decode(path, rules)?;
    let normal = if rules.normalize || rules.merge_slashes {
        segments(&decoded, rules)?
    } else {
        decoded
    };
    Ok((normal != path).then_some(normal))
}

/// One scan: whether any step could change or refuse `path`.
fn needs_work(path: &[u8], rules: &PathRules) -> bool {
    let escapes_matter = rules.normalize || rules.escaped_slashes != EscapedSlashes::KeepUnchanged;
    let mut previous = 0u8;
    for (at, &byte) in path.iter().enumerate() {
        match byte {
            b'%' | b'\\' if escapes_matter => return true,
            // A segment that is `.` or `..`.
            b'.' if rules.normalize && previous == b'/' => {
                let after = |n: usize| path.get(at + n).copied();
                if matches!(after(1), None | Some(b'/'))
                    || (after(1) == Some(b'.') && matches!(after(2), None | Some(b'/')))
                {
                    return true;
                }
            }
            b'/' if rules.merge_slashes && previous == b'/' => return true,
            _ => {}
        }
        previous = byte;
    }
    false
}

/// RFC 3986 unreserved characters (§2.3): decoding them changes no meaning.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Steps 1 and 2: percent-encodings checked and made canonical, escaped slashes handled.
/// With `normalize` off, only step 2 (the encodings are left as they are).
fn decode(path: &str, rules: &PathRules) -> Result<String, PathRejection> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        let (value, len) = match byte {
            b'%' => match (
                bytes.get(at + 1).copied().and_then(hex_value),
                bytes.get(at + 2).copied().and_then(hex_value),
            ) {
                (Some(high), Some(low)) => (high << 4 | low, 3),
                _ if rules.normalize => return Err(PathRejection::BadPercent),
                // Not normalising: a stray `%` is the upstream's to judge.
                _ => (b'%', 0),
            },
            _ => (byte, 1),
        };
        let escaped = len == 3;
        if value == b'/' && escaped || value == b'\\' {
            match rules.escaped_slashes {
                EscapedSlashes::RejectRequest => return Err(PathRejection::EscapedSlash),
                EscapedSlashes::UnescapeAndForward => out.push(b'/'),
                EscapedSlashes::KeepUnchanged if escaped => {
                    out.extend_from_slice(&[
                        b'%',
                        HEX[usize::from(value >> 4)],
                        HEX[usize::from(value & 15)],
                    ]);
                }
                EscapedSlashes::KeepUnchanged => out.push(b'\\'),
            }
        } else if !escaped {
            out.push(byte);
        } else if rules.normalize && is_unreserved(value) {
            out.push(value);
        } else if rules.normalize {
            out.extend_from_slice(&[
                b'%',
                HEX[usize::from(value >> 4)],
                HEX[usize::from(value & 15)],
            ]);
        } else {
            out.extend_from_slice(&bytes[at..at + 3]);
        }
        at += len.max(1);
    }
    // Only ASCII was added, and only whole UTF-8 sequences of `path` were copied.
    Ok(String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// Steps 2 (hidden dots), 3 and 4 over the segments of a decoded path.
fn segments(path: &str, rules: &PathRules) -> Result<String, PathRejection> {
    let mut kept: Vec<&str> = Vec::new();
    let mut parts = path.strip_prefix('/').unwrap_or(path).split('/').peekable();
    let mut trailing_slash = false;
    while let Some(segment) = parts.next() {
        let last = parts.peek().is_none();
        match segment {
            "." | ".." if rules.normalize => {
                if segment == ".." && kept.pop().is_none() {
                    return Err(PathRejection::AboveRoot);
                }
                trailing_slash = last;
            }
            "" if last => trailing_slash = true,
            "" if rules.merge_slashes => {}
            _ => {
                if rules.normalize && hides_dot_segment(segment) {
                    return Err(PathRejection::HiddenDotSegment);
                }
                kept.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || kept.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Whether the parts of `segment` between the encoded slashes and backslashes it keeps
/// include `.` or `..` (`..%2Fadmin`, `%5C..`).
fn hides_dot_segment(segment: &str) -> bool {
    if !segment.contains(['%', '\\']) {
        return false;
    }
    segment
        .split('\\')
        .flat_map(|part| part.split("%2F"))
        .flat_map(|part| part.split("%5C"))
        .any(|part| part == "." || part == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(rules: PathRules, path: &str) -> Result<String, PathRejection> {
        normalize(path, &rules).map(|changed| changed.unwrap_or_else(|| path.to_owned()))
    }

    fn default(path: &str) -> Result<String, PathRejection> {
        with(PathRules::default(), path)
    }

    #[test]
    fn ordinary_paths_are_left_alone_without_an_allocation() {
        for path in [
            "/",
            "/a/b",
            "/file.txt",
            "/v1.2/x",
            "/a/.hidden",
            "/a/..b",
            "/a//b",
            "/a-b_c~d",
        ] {
            assert_eq!(normalize(path, &PathRules::default()), Ok(None), "{path}");
        }
    }

    #[test]
    fn dot_segments_are_removed_as_rfc_3986_says() {
        for (given, normal) in [
            ("/a/../b", "/b"),
            ("/a/./b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/..", "/"),
            ("/.", "/"),
            ("/a//../b", "/a/b"),
            ("/public/%2e%2e/X", "/X"),
            ("/public/%2E./X", "/X"),
            ("/public/.%2e", "/"),
            ("/%41%62%2d%7E", "/Ab-~"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%3f", "/a%3F"),
            ("/caf%C3%A9", "/caf%C3%A9"),
        ] {
            assert_eq!(default(given).as_deref(), Ok(normal), "{given}");
        }
    }

    #[test]
    fn what_cannot_be_normalised_safely_is_refused() {
        for (given, why) in [
            ("/..", PathRejection::AboveRoot),
            ("/a/../..", PathRejection::AboveRoot),
            ("/%2e%2e/x", PathRejection::AboveRoot),
            ("/a%", PathRejection::BadPercent),
            ("/a%2", PathRejection::BadPercent),
            ("/a%zz", PathRejection::BadPercent),
            ("/%%32%65%%32%65/x", PathRejection::BadPercent),
            ("/public/..%2fX", PathRejection::HiddenDotSegment),
            ("/public/..%5CX", PathRejection::HiddenDotSegment),
            ("/public/..\\X", PathRejection::HiddenDotSegment),
            ("/public/x%2F..", PathRejection::HiddenDotSegment),
            ("/public/%2e%2e%2fX", PathRejection::HiddenDotSegment),
        ] {
            assert_eq!(default(given), Err(why), "{given}");
        }
        // An encoded slash that hides no dot is kept: `group%2Fproject` is a common API id.
        assert_eq!(
            default("/projects/group%2fproject").as_deref(),
            Ok("/projects/group%2Fproject")
        );
    }

    #[test]
    fn escaped_slashes_follow_their_setting() {
        let reject = PathRules {
            escaped_slashes: EscapedSlashes::RejectRequest,
            ..PathRules::default()
        };
        assert_eq!(with(reject, "/a%2Fb"), Err(PathRejection::EscapedSlash));
        assert_eq!(with(reject, "/a\\b"), Err(PathRejection::EscapedSlash));
        assert_eq!(with(reject, "/a%25b").as_deref(), Ok("/a%25b"));
        let unescape = PathRules {
            escaped_slashes: EscapedSlashes::UnescapeAndForward,
            ..PathRules::default()
        };
        assert_eq!(with(unescape, "/public/..%2fX").as_deref(), Ok("/X"));
        assert_eq!(with(unescape, "/a%5cb\\c").as_deref(), Ok("/a/b/c"));
        assert_eq!(
            with(unescape, "/a/..%2f..%2fb"),
            Err(PathRejection::AboveRoot)
        );
    }

    #[test]
    fn slashes_are_merged_only_when_asked() {
        let merge = PathRules {
            merge_slashes: true,
            ..PathRules::default()
        };
        assert_eq!(with(merge, "//a///b//").as_deref(), Ok("/a/b/"));
        assert_eq!(with(merge, "//").as_deref(), Ok("/"));
        assert_eq!(default("//a///b//").as_deref(), Ok("//a///b//"));
    }

    #[test]
    fn without_normalize_only_the_slash_settings_apply() {
        let off = PathRules {
            normalize: false,
            ..PathRules::default()
        };
        for path in ["/a/../b", "/a%2e%2e", "/a%zz", "/..%2f"] {
            assert_eq!(normalize(path, &off), Ok(None), "{path}");
        }
        let off_merging = PathRules {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::UnescapeAndForward,
            ..off
        };
        assert_eq!(
            with(off_merging, "//a/../b%2Fc").as_deref(),
            Ok("/a/../b/c")
        );
    }
}
