//! Properties of everything the Lease strategy parses or validates (issue 5, item 4): arbitrary
//! Lease specs from the API server, arbitrary timings, arbitrary lock names. None may panic;
//! every rejection is a typed error; the accepted sets are exactly the reference rules.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_leader::{
    internal::{validate_name, LeaseRecord},
    internal::{LeaseConfigExt as _, Validate as _},
    Error, LeaseConfig,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// `cases` runs per property, or `PROPTEST_CASES` if set (a long fuzzing run). Failures are
/// not persisted: odd inputs found are kept as regression unit tests beside the code.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// === Lease records ===

/// Odd timestamps: valid RFC 3339 at the edges, other precisions and offsets, and garbage.
fn timestamp() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("2026-11-29T22:00:00.123456Z")),
        Just(json!("1970-01-01T00:00:00Z")),
        Just(json!("0000-01-01T00:00:00Z")),
        Just(json!("9999-12-31T23:59:59.999999999Z")),
        Just(json!("1969-12-31T23:59:59.999999Z")),
        Just(json!("2016-12-31T23:59:60Z")), // leap second
        Just(json!("2026-01-01T00:00:00+14:00")),
        Just(json!("2026-01-01T00:00:00-23:59")),
        Just(json!("2026-01-01t00:00:00z")),
        Just(json!("2026-01-01T00:00:00.1234567890123Z")),
        Just(json!("2026-02-30T00:00:00Z")),
        Just(json!("-000001-01-01T00:00:00Z")),
        Just(json!("+010000-01-01T00:00:00Z")),
        Just(json!("2026-01-01")),
        Just(json!("")),
        Just(json!(0)),
        Just(json!(1.5e300)),
        (0i64..253_402_300_800, 0u32..1_000_000_000).prop_map(|(s, n)| {
            let t = k8s_openapi::jiff::Timestamp::new(s, n as i32).unwrap();
            json!(t.to_string())
        }),
        ".{0,40}".prop_map(Value::String),
    ]
}

/// Numbers as an API server, a buggy writer or an attacker could put them: in and out of `int32`.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(i32::MAX)),
        Just(json!(i32::MIN)),
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!(-0.0)),
        Just(json!(1e308)),
        any::<i32>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        "[0-9]{1,12}".prop_map(Value::String),
    ]
}

/// Any JSON value, small.
fn anything() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field: absent (`None`), null, a value of the right kind, or anything.
fn field(right: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        2 => Just(None),
        2 => Just(Some(Value::Null)),
        6 => right.prop_map(Some),
        1 => anything().prop_map(Some),
    ]
}

fn holder() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("")),
        Just(json!("me")),
        ".{0,64}".prop_map(Value::String)
    ]
}

prop_compose! {
    fn lease_json()(
        holder in field(holder()),
        duration in field(number()),
        acquire in field(timestamp()),
        renew in field(timestamp()),
        transitions in field(number()),
        extra in field(anything()),
        spec_kind in 0..10u8,
    ) -> Value {
        let mut spec = serde_json::Map::new();
        for (k, v) in [("holderIdentity", holder), ("leaseDurationSeconds", duration),
                       ("acquireTime", acquire), ("renewTime", renew), ("leaseTransitions", transitions),
                       ("preferredHolder", extra)] {
            if let Some(v) = v {
                spec.insert(k.into(), v);
            }
        }
        let spec = match spec_kind {
            0 => None,
            1 => Some(Value::Null),
            _ => Some(Value::Object(spec)),
        };
        let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ns", "resourceVersion": "7"}});
        if let Some(spec) = spec {
            lease["spec"] = spec;
        }
        lease
    }
}

/// What client-go's `LeaseSpecToLeaderElectionRecord` makes of a spec, independently written.
fn reference_record(spec: Option<&LeaseSpec>) -> (Option<String>, Option<u64>, u32) {
    let Some(spec) = spec else { return (None, None, 0) };
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let duration = match spec.lease_duration_seconds {
        Some(s) if s >= 1 => Some(s as u64),
        _ => None,
    };
    let transitions = match spec.lease_transitions {
        Some(t) if t >= 0 => t as u32,
        _ => 0,
    };
    (holder, duration, transitions)
}

proptest! {
    #![proptest_config(config(2000))]

    /// Arbitrary specs never panic: they are rejected by deserialisation (a typed serde error)
    /// or read into a record exactly as client-go reads them; and the record survives a trip
    /// through the API (written, serialised, read back) unchanged up to microseconds.
    #[test]
    fn any_lease_spec_is_read_without_panic(json in lease_json()) {
        let Ok(lease) = serde_json::from_value::<Lease>(json) else { return Ok(()) };
        let record = LeaseRecord::from_lease(&lease);
        let (holder, secs, transitions) = reference_record(lease.spec.as_ref());
        prop_assert_eq!(&record.holder, &holder);
        prop_assert_eq!(record.lease_duration, secs.map(Duration::from_secs));
        prop_assert_eq!(record.transitions, transitions);
        let _ = (record.acquired_at(), record.renewed_at());

        // Written back (as a renewal keeps the fields it read) and read again: the same record.
        let mut spec = lease.spec.clone().unwrap_or_default();
        let secs_i32 = record.lease_duration.map_or(0, |d| i32::try_from(d.as_secs()).unwrap());
        record.write_to(&mut spec, secs_i32);
        prop_assert_eq!(LeaseRecord::from_spec(&spec), record.clone());

        // Through JSON, as sent to the API server: MicroTime keeps microseconds.
        let written = Lease { spec: Some(spec), ..lease };
        if let Ok(text) = serde_json::to_string(&written) {
            let back: Lease = serde_json::from_str(&text).expect("what we serialise, we read");
            let again = LeaseRecord::from_lease(&back);
            let micros = |t: Option<k8s_openapi::jiff::Timestamp>| t.map(|t| t.as_microsecond());
            prop_assert_eq!(&again.holder, &record.holder);
            prop_assert_eq!(again.lease_duration, record.lease_duration);
            prop_assert_eq!(again.transitions, record.transitions);
            prop_assert_eq!(micros(again.acquire_time), micros(record.acquire_time));
            prop_assert_eq!(micros(again.renew_time), micros(record.renew_time));
        }
    }

    /// Raw bytes from the wire never panic the deserialiser.
    #[test]
    fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), text in ".{0,200}") {
        let _ = serde_json::from_slice::<Lease>(&bytes).map(|l| LeaseRecord::from_lease(&l));
        let _ = serde_json::from_str::<Lease>(&text).map(|l| LeaseRecord::from_lease(&l));
    }
}

// === LeaseConfig ===

/// Durations at every scale, with the edges client-go's arithmetic cares about.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_secs(1)),
        Just(Duration::from_nanos(i64::MAX as u64)),
        Just(Duration::from_nanos(i64::MAX as u64 + 1)),
        Just(Duration::from_secs(i32::MAX as u64)),
        Just(Duration::from_secs(i32::MAX as u64) + Duration::from_nanos(1)),
        Just(Duration::MAX),
        (0u64..10).prop_map(Duration::from_nanos),
        (0u64..100_000).prop_map(Duration::from_millis),
        (0u64..3_000_000_000).prop_map(Duration::from_secs),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// client-go's rules (`NewLeaderElector`), written independently in integer nanoseconds, plus
/// kube-leader's documented limits of what a Lease and `time.Duration` can hold.
fn reference_valid(c: &LeaseConfig) -> bool {
    let ns = |d: Duration| d.as_nanos();
    let go_max = i64::MAX as u128; // time.Duration
    let (lease, renew, retry) = (ns(c.lease_duration), ns(c.renew_deadline), ns(c.retry_period));
    let durations = [
        Some(c.lease_duration),
        Some(c.renew_deadline),
        Some(c.retry_period),
        Some(c.shutdown_grace),
        c.api_timeout,
    ];
    lease >= 1
        && renew >= 1
        && retry >= 1
        && durations.iter().flatten().all(|d| ns(*d) <= go_max)
        && lease >= 1_000_000_000
        && lease <= i32::MAX as u128 * 1_000_000_000
        && lease > renew
        // renewDeadline > time.Duration(JitterFactor * float64(retryPeriod))
        && renew > (1.2 * retry as f64) as u128
        && c.api_timeout.is_none_or(|t| !t.is_zero())
}

proptest! {
    #![proptest_config(config(5000))]

    /// Validation never panics, rejects with `InvalidConfig`, and accepts exactly the reference.
    #[test]
    fn config_validation_is_total_and_exact(
        lease in duration(), renew in duration(), retry in duration(),
        grace in duration(), timeout in prop::option::of(duration()),
    ) {
        let mut c = LeaseConfig::default().lease_duration(lease).renew_deadline(renew).retry_period(retry);
        c.shutdown_grace = grace;
        c.api_timeout = timeout;
        let got = c.validate();
        prop_assert_eq!(got.is_ok(), reference_valid(&c), "{:?}: {:?}", c, got);
        if let Err(e) = got {
            prop_assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        }
        let _ = c.lease_duration_seconds();
    }

    /// Near the jitter boundary, in the range real configurations use.
    #[test]
    fn jitter_boundary(retry_ms in 1u64..60_000, delta_ns in -3i64..3) {
        let retry = Duration::from_millis(retry_ms);
        let boundary = (1.2 * retry.as_nanos() as f64) as i128;
        let renew = Duration::from_nanos((boundary + delta_ns as i128).max(1) as u64);
        let c = LeaseConfig::default().lease_duration(Duration::from_secs(3600)).renew_deadline(renew).retry_period(retry);
        prop_assert_eq!(c.validate().is_ok(), reference_valid(&c));
    }
}

// === lock names ===

/// Kubernetes' `IsDNS1123Subdomain`, as a byte-by-byte state machine: at most 253 bytes of
/// lower-case alphanumerics, '-' and '.', each '.'-separated label starting and ending with an
/// alphanumeric.
fn reference_dns1123_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 253 {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut prev: Option<u8> = None; // None: at the start of a label
    for &c in b {
        let ok = match c {
            b'.' => prev.is_some_and(alnum),
            b'-' => prev.is_some(),
            c => alnum(c),
        };
        if !ok {
            return false;
        }
        prev = if c == b'.' { None } else { Some(c) };
    }
    prev.is_some_and(alnum)
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9.-]{0,12}",
        2 => "[a-z0-9]([a-z0-9-]{0,5}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,5}[a-z0-9])?){0,3}",
        1 => "[a-z0-9.-]{250,256}",
        1 => "[a-z0-9]{250,256}",
        1 => "[A-Za-z0-9_/ .äß\u{0}-]{0,12}",
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config(5000))]

    /// `validate_name` never panics and accepts exactly the DNS-1123 subdomains.
    #[test]
    fn lock_names_are_exactly_dns1123_subdomains(s in name()) {
        let got = validate_name(&s);
        prop_assert_eq!(got.is_ok(), reference_dns1123_subdomain(&s), "{:?}: {:?}", s, got);
        if let Err(e) = got {
            prop_assert!(matches!(e, Error::InvalidLockName { .. }), "{e}");
        }
    }
}

#[test]
fn reference_agrees_on_known_names() {
    for ok in [
        "a",
        "a.b",
        "a-b.c-d",
        "0",
        "a--b",
        &"a".repeat(253),
        &format!("{}.b", "a".repeat(63)),
    ] {
        assert!(reference_dns1123_subdomain(ok), "{ok}");
    }
    for bad in [
        "",
        ".",
        "a.",
        ".a",
        "-a",
        "a-",
        "a.-b",
        "a-.b",
        "a..b",
        "A",
        "a_b",
        &"a".repeat(254),
    ] {
        assert!(!reference_dns1123_subdomain(bad), "{bad}");
    }
}
