//! The fence's decisions, as pure functions of the admission request and the lock as read: who
//! is fenced, which token a write carries, the stamp the mutating half puts on, and whether the
//! validating half lets the write through.

use std::collections::BTreeMap;

use kube_leader::{
    fence::{FENCED_TOKEN_ANNOTATION, FENCING_TOKEN_EXTRA},
    internal::fence::LockState,
};

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

/// The token stamped on an object, if any: `Err` when the annotation is not a number.
pub(crate) fn stamp(annotations: Option<&BTreeMap<String, String>>) -> Option<Result<u64, String>> {
    let v = annotations?.get(FENCED_TOKEN_ANNOTATION)?;
    Some(v.trim().parse().map_err(|_| v.clone()))
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

/// What a request is, for the messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Write<'a> {
    /// CREATE, UPDATE, DELETE.
    pub(crate) operation: &'a str,
    /// The plural resource.
    pub(crate) resource: &'a str,
    /// The object's namespace.
    pub(crate) namespace: &'a str,
    /// The object's name.
    pub(crate) name: &'a str,
    /// The writer's user name.
    pub(crate) user: &'a str,
}

/// The validating half's verdict on a fenced writer's write with `token`: `Err` is the refusal
/// message. `stored` is the stamp on the stored object (update, delete), `stamped` the one on
/// the object as it would be stored (create, update: the mutating half put it there), `lock`
/// the lock (`lock_name`) as read just now.
pub(crate) fn judge(
    write: Write<'_>,
    token: u64,
    stored: Option<Result<u64, String>>,
    stamped: Option<Option<Result<u64, String>>>,
    lock_name: &str,
    lock: &LockState,
) -> Result<(), String> {
    let what = format!(
        "fenced: {} of {} {}/{} by {} refused",
        write.operation.to_lowercase(),
        write.resource,
        write.namespace,
        write.name,
        write.user
    );
    let (current, holder, exact) = match lock {
        LockState::Missing => {
            return Err(format!(
                "{what}: its fencing token is {token}, but lock {lock_name} does not exist: nobody \
                 leads (current token: none, holder: none)"
            ))
        }
        LockState::Held { token, holder, exact } => (*token, holder.as_deref().unwrap_or("nobody"), *exact),
    };
    let current_words = if exact {
        format!("current token {current}, held by {holder}")
    } else {
        format!("current token at least {current} (not yet stored by the holder), held by {holder}")
    };
    match stored {
        Some(Ok(s)) if token < s => {
            return Err(format!(
                "{what}: its fencing token {token} is older than token {s} a later leader stored \
                 on the object ({FENCED_TOKEN_ANNOTATION}); lock {lock_name}: {current_words}"
            ))
        }
        Some(Err(v)) => {
            return Err(format!(
                "{what}: the object's {FENCED_TOKEN_ANNOTATION} {v:?} is not a number; lock \
                 {lock_name}: {current_words}"
            ))
        }
        _ => {}
    }
    if token < current {
        return Err(format!(
            "{what}: its fencing token {token} is older than lock {lock_name}'s: {current_words}"
        ));
    }
    if let Some(stamped) = stamped {
        if stamped != Some(Ok(token)) {
            return Err(format!(
                "{what}: the object as it would be stored does not carry the write's token \
                 {token} in {FENCED_TOKEN_ANNOTATION} (is the fence's \
                 MutatingWebhookConfiguration applied?); lock {lock_name}: {current_words}"
            ));
        }
    }
    Ok(())
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

    const W: Write<'static> = Write {
        operation: "UPDATE",
        resource: "configmaps",
        namespace: "app",
        name: "orders",
        user: "user-1",
    };

    fn held(token: u64) -> LockState {
        LockState::Held {
            token,
            holder: Some("pod-b".into()),
            exact: true,
        }
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
    fn the_current_leader_passes() {
        judge(W, 10, Some(Ok(10)), Some(Some(Ok(10))), "app/l", &held(10)).unwrap();
        judge(W, 11, Some(Ok(10)), Some(Some(Ok(11))), "app/l", &held(11)).unwrap();
        judge(W, 11, None, None, "app/l", &held(11)).unwrap();
    }

    #[test]
    fn an_older_token_than_the_stored_one_is_refused_naming_everything() {
        let e = judge(W, 9, Some(Ok(10)), Some(Some(Ok(9))), "app/l", &held(9)).unwrap_err();
        for s in [
            "update of configmaps app/orders by user-1",
            "token 9",
            "token 10",
            "app/l",
            "pod-b",
        ] {
            assert!(e.contains(s), "{s}: {e}");
        }
    }

    #[test]
    fn an_older_token_than_the_lock_is_refused() {
        let e = judge(W, 9, None, Some(Some(Ok(9))), "app/l", &held(12)).unwrap_err();
        assert!(
            e.contains("older than lock app/l's: current token 12, held by pod-b"),
            "{e}"
        );
        let e = judge(W, 9, None, None, "app/l", &LockState::Missing).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn an_unstamped_object_is_refused() {
        let e = judge(W, 12, None, Some(None), "app/l", &held(12)).unwrap_err();
        assert!(e.contains("MutatingWebhookConfiguration"), "{e}");
        let e = judge(W, 12, None, Some(Some(Ok(13))), "app/l", &held(12)).unwrap_err();
        assert!(e.contains("does not carry"), "{e}");
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
