//! Reading a recorded step back from its `tracing` event: the one field visitor that every
//! recorder (the chaos candidates, the mock tests) uses.

use std::fmt;

use serde_json::{json, Value};
use tracing::field::{Field, Visit};

/// The target of every decision step's event.
pub const STEP_TARGET: &str = "kube_leader::step";

/// The step an event carries, as `{"kind": .., "step": {..}}`, or `None` for an event that is
/// not a step (another target). A step whose JSON does not parse keeps its kind, with a null
/// step, so that the replay reports it rather than losing it.
pub fn step_of(event: &tracing::Event<'_>) -> Option<Value> {
    if event.metadata().target() != STEP_TARGET {
        return None;
    }
    let mut fields = StepFields::default();
    event.record(&mut fields);
    let step: Value = serde_json::from_str(&fields.step).unwrap_or(Value::Null);
    Some(json!({"kind": fields.kind, "step": step}))
}

/// The fields of a step event: `kind` (a `&'static str`) and `step` (JSON, recorded with `%`).
#[derive(Default)]
struct StepFields {
    kind: String,
    step: String,
}

impl Visit for StepFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "kind" {
            self.kind = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "step" => self.step = format!("{value:?}"),
            "kind" => self.kind = format!("{value:?}"),
            _ => {}
        }
    }
}
