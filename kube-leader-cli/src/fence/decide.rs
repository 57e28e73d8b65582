//! The fence's decisions, as pure functions of the admission request and the lock as read: who
//! is fenced, which token a write carries, and the stamp the mutating half puts on. Whether the
//! validating half lets the write through ([`judge`]) is the library's, where the model checker
//! drives it too.

use std::collections::BTreeMap;

pub(crate) use kube_leader::internal::fence::{judge, stamp, Write};
use kube_leader::internal::fence::{FENCED_TOKEN_ANNOTATION, FENCING_TOKEN_EXTRA};

use super::config::KUBE_SYSTEM;

/// What the request's user info says about the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Writer {
    /// Not a fenced writer of the rule: its write passes untouched.
    Other,
    /// A fenced writer with this token.
    Token(u64),
    /// A fenced writer without a token.
    NoToken,
    /// A fenced writer whose token cannot be read (why).
    BadToken(String),
}

/// The writer of a request by `user` with user-info `extra`, for a rule that fences `fenced`.
pub(crate) fn writer(fenced: bool, extra: Option<&BTreeMap<String, Vec<String>>>) -> Writer {
    if !fenced {
        return Writer::Other;
    }
    let values = extra.and_then(|e| e.get(FENCING_TOKEN_EXTRA));
    match values.map(Vec::as_slice) {
        None | Some([]) => Writer::NoToken,
        Some([one]) => match one.trim().parse() {
            Ok(t) => Writer::Token(t),
            Err(_) => Writer::BadToken(format!("{FENCING_TOKEN_EXTRA} {one:?} is not a number")),
        },
        Some(many) => Writer::BadToken(format!(
            "{FENCING_TOKEN_EXTRA} has {} values; send one",
            many.len()
        )),
    }
}

/// Whether the fence stays out of a request whatever the rule says: anything in kube-system,
/// and Leases (also when an API server's matching would send them here).
pub(crate) fn out_of_scope(namespace: Option<&str>, group: &str, resource: &str) -> bool {
    namespace == Some(KUBE_SYSTEM) || (group == "coordination.k8s.io" && resource == "leases")
}

/// The JSON patch by which the mutating half stamps `token` on an object with `annotations`.
pub(crate) fn stamp_patch(has_annotations: bool, token: u64) -> serde_json::Value {
    if has_annotations {
        // JSON pointer: '/' in a key is written "~1".
        serde_json::json!([{
            "op": "add",
            "path": format!("/metadata/annotations/{}", FENCED_TOKEN_ANNOTATION.replace('~', "~0").replace('/', "~1")),
            "value": token.to_string(),
        }])
    } else {
        serde_json::json!([{
            "op": "add",
            "path": "/metadata/annotations",
            "value": { FENCED_TOKEN_ANNOTATION: token.to_string() },
        }])
    }
}

/// The refusal of a fenced writer's write without a usable token.
pub(crate) fn no_token(write: Write<'_>, why: &str, lock_name: &str) -> String {
    format!(
        "fenced: {} of {} {}/{} by {} refused: {why}; {} is a fenced writer of objects guarded \
         by lock {lock_name} and must send its fencing token (Impersonate-User: itself, \
         Impersonate-Extra-kube-leader.io%2Ffencing-token: TOKEN; see docs/fence.md)",
        write.operation.to_lowercase(),
        write.resource,
        write.namespace,
        write.name,
        write.user,
        write.user,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(values: &[&str]) -> BTreeMap<String, Vec<String>> {
        [(
            FENCING_TOKEN_EXTRA.to_string(),
            values.iter().map(|s| s.to_string()).collect(),
        )]
        .into()
    }

    #[test]
    fn writers_and_their_tokens() {
        assert_eq!(writer(false, Some(&extra(&["5"]))), Writer::Other);
        assert_eq!(writer(true, Some(&extra(&["5"]))), Writer::Token(5));
        assert_eq!(writer(true, None), Writer::NoToken);
        assert_eq!(writer(true, Some(&extra(&[]))), Writer::NoToken);
        assert!(matches!(writer(true, Some(&extra(&["x"]))), Writer::BadToken(_)));
        assert!(matches!(
            writer(true, Some(&extra(&["1", "2"]))),
            Writer::BadToken(_)
        ));
    }

    #[test]
    fn kube_system_and_leases_are_out_of_scope() {
        assert!(out_of_scope(Some("kube-system"), "", "configmaps"));
        assert!(out_of_scope(Some("app"), "coordination.k8s.io", "leases"));
        assert!(!out_of_scope(Some("app"), "", "configmaps"));
    }

    #[test]
    fn the_stamp_patch_escapes_the_key() {
        let p = stamp_patch(true, 7);
        assert_eq!(p[0]["path"], "/metadata/annotations/kube-leader.io~1fenced-token");
        assert_eq!(p[0]["value"], "7");
        let p = stamp_patch(false, 7);
        assert_eq!(p[0]["value"][FENCED_TOKEN_ANNOTATION], "7");
    }
}
