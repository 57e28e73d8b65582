//! The fence's verdict, as a pure function of the write, the stamps on the object and the lock
//! as read: what `kube-leader fence`'s validating webhook decides, and what the model checker
//! (`crate::model`) drives. Not public API: reached through `kube_leader::internal::fence`.

use std::collections::BTreeMap;

use super::{lock::LockState, FENCED_TOKEN_ANNOTATION};

/// The token stamped on an object, if any: `Err` when the annotation is not a number.
pub fn stamp(annotations: Option<&BTreeMap<String, String>>) -> Option<Result<u64, String>> {
    let v = annotations?.get(FENCED_TOKEN_ANNOTATION)?;
    Some(v.trim().parse().map_err(|_| v.clone()))
}

/// What a request is, for the messages.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// CREATE, UPDATE, DELETE.
    pub operation: &'a str,
    /// The plural resource.
    pub resource: &'a str,
    /// The object's namespace.
    pub namespace: &'a str,
    /// The object's name.
    pub name: &'a str,
    /// The writer's user name.
    pub user: &'a str,
}

/// The validating half's verdict on a fenced writer's write with `token`: `Err` is the refusal
/// message. `stored` is the stamp on the stored object (update, delete), `stamped` the one on
/// the object as it would be stored (create, update: the mutating half put it there), `lock`
/// the lock (`lock_name`) as read just now.
pub fn judge(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
