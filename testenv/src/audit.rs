//! The API server's audit log of the restricted users' requests, for counting them.

use std::{collections::HashSet, path::Path};

use serde_json::Value;

use crate::{Error, Result};

/// One audit event: what a user asked the API server, and what it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditEvent {
    /// Identifies the request; the events of one request share it.
    pub audit_id: String,
    /// `ResponseStarted` (watches only) or `ResponseComplete` (or `Panic`).
    pub stage: String,
    /// The user name, `user-<n>`.
    pub user: String,
    /// The Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// The request path with its query, e.g. `/api/v1/namespaces/x/configmaps?limit=500`.
    pub request_uri: String,
    /// The resource, e.g. `leases`; `None` for non-resource paths like `/api`.
    pub resource: Option<String>,
    /// The subresource, e.g. `status`.
    pub subresource: Option<String>,
    /// The namespace of the object or collection.
    pub namespace: Option<String>,
    /// The object's name; `None` for collections.
    pub name: Option<String>,
    /// The HTTP status code of the response, when known.
    pub code: Option<u16>,
}

/// An audit policy that records the restricted users' requests at the `Metadata` level
/// (no bodies), once each (twice for watches), and nothing else.
pub(crate) fn policy(restricted_users: usize) -> String {
    policy_with(restricted_users, "")
}

/// [`policy`]'s, with `first_rules` (YAML list items, each line indented as a rule's) before
/// the restricted users' rule: a harness that also audits another user's requests.
pub fn audit_policy_with(first_rules: &str) -> String {
    policy_with(crate::RESTRICTED_USERS, first_rules)
}

fn policy_with(restricted_users: usize, first_rules: &str) -> String {
    let users: Vec<String> = (1..=restricted_users).map(|i| format!("\"user-{i}\"")).collect();
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
{first_rules}- level: Metadata
  users: [{}]
- level: None
",
        users.join(", ")
    )
}

/// The events of `user` in the audit log at `path` (none if the log does not exist yet).
pub(crate) fn read(path: &Path, user: &str) -> Result<Vec<AuditEvent>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("read", path, e)),
    };
    Ok(text
        .lines()
        // The last line may be half written.
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| parse(&event))
        .filter(|event| event.user == user)
        .collect())
}

/// How many distinct requests the events describe.
pub(crate) fn count_requests(events: &[AuditEvent]) -> usize {
    events
        .iter()
        .map(|event| event.audit_id.as_str())
        .collect::<HashSet<_>>()
        .len()
}

fn parse(event: &Value) -> Option<AuditEvent> {
    let string = |value: &Value| value.as_str().map(str::to_owned);
    let object = &event["objectRef"];
    Some(AuditEvent {
        audit_id: string(&event["auditID"])?,
        stage: string(&event["stage"])?,
        user: string(&event["user"]["username"])?,
        verb: string(&event["verb"])?,
        request_uri: string(&event["requestURI"])?,
        resource: string(&object["resource"]),
        subresource: string(&object["subresource"]),
        namespace: string(&object["namespace"]),
        name: string(&object["name"]),
        code: event["responseStatus"]["code"]
            .as_u64()
            .and_then(|code| u16::try_from(code).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/kl-x/configmaps","verb":"list","user":{"username":"user-2","uid":"102","groups":["system:authenticated"]},"objectRef":{"resource":"configmaps","namespace":"kl-x","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Forbidden","code":403}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseStarted","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kl-x/leases?watch=true","verb":"watch","user":{"username":"user-2"},"objectRef":{"resource":"leases","namespace":"kl-x","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a3","stage":"ResponseComplete","requestURI":"/api","verb":"get","user":{"username":"user-3"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kl-x/leases?watch=true","verb":"watch","user":{"username":"user-2"},"objectRef":{"resource":"leases","namespace":"kl-x","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Meta"#;

    #[test]
    fn reads_one_users_events_and_counts_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, LOG).unwrap();

        let events = read(&path, "user-2").unwrap();

        assert_eq!(events.len(), 3);
        assert_eq!(events[0].verb, "list");
        assert_eq!(events[0].resource.as_deref(), Some("configmaps"));
        assert_eq!(events[0].namespace.as_deref(), Some("kl-x"));
        assert_eq!(events[0].code, Some(403));
        assert_eq!(count_requests(&events), 2);
        assert_eq!(read(&path, "user-3").unwrap()[0].resource, None);
    }

    #[test]
    fn a_missing_log_has_no_events() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("audit.log"), "user-1").unwrap(), Vec::new());
    }

    #[test]
    fn the_policy_names_every_restricted_user() {
        let policy = policy(40);
        assert!(policy.contains(r#"users: ["user-1", "user-2", "#), "{policy}");
        assert!(policy.contains(r#""user-40"]"#), "{policy}");
    }
}
