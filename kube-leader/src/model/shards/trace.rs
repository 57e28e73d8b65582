//! A counterexample, printed: one line a step, the store and every replica's view.

use super::{Action, Life, State, Tm, World};
use crate::model::tick;

/// A term, short: its table state, whether its work stopped, its keeper's bound and token.
fn term(t: &Tm) -> String {
    let state = match t.state {
        State::Active => "active".to_string(),
        State::Leaving { until, release } => {
            format!(
                "leaving until@{}{}",
                tick(until),
                if release { " release" } else { "" }
            )
        }
        State::Releasing => "releasing".into(),
        State::Gone => match t.lost_at {
            Some(at) => format!("gone (lost@{at})"),
            None => "gone".into(),
        },
    };
    let work = if t.done { " work stopped" } else { "" };
    format!(
        "token{} {state}{work} confirmed_until@{}",
        t.held.term.fencing_token(),
        t.confirmed
    )
}

/// A counterexample, one line a step: the store, then every replica, then the action.
pub(crate) fn trace(path: stateright::Path<World, Action>) -> String {
    let mut out = String::new();
    for (w, action) in path.into_vec() {
        out.push_str(&format!("t={} store:", w.real));
        for (s, l) in w.store.iter().enumerate() {
            out.push_str(&format!(" s{s}: {l:?};"));
        }
        if w.token_regressed {
            out.push_str(" (a fencing token went BACK)");
        }
        if w.taken_while_stopping {
            out.push_str(" (a shard was TAKEN AGAIN while its lost work may still be stopping)");
        }
        out.push('\n');
        for (i, r) in w.reps.iter().enumerate() {
            let mut life = match (r.life, r.stopping) {
                (Life::Up, true) => "leaving".to_string(),
                (l, _) => format!("{l:?}").to_lowercase(),
            };
            if r.stalled {
                life.push_str(", membership stalled");
            }
            out.push_str(&format!(
                "    r{i}.{} clock {} {life}; in flight {:?}; {} events pending\n",
                r.incarnation,
                w.now(i),
                r.flight.as_ref().map(|f| (f.shard, f.why, f.sent, &f.answer)),
                r.watch.len()
            ));
            for (s, slot) in r.slots.iter().enumerate() {
                let allowed = |on: bool| if on { " ALLOWED" } else { "" };
                let now = w.now(i);
                if let Some(t) = &slot.term {
                    let on = !t.done && now < t.confirmed && r.life == Life::Up;
                    out.push_str(&format!("        s{s}: {}{}\n", term(t), allowed(on)));
                }
                if let Some(c) = slot.zombie {
                    let on = now < c && r.life == Life::Up;
                    out.push_str(&format!(
                        "        s{s}: a dropped lost term still working, confirmed_until@{c}{}\n",
                        allowed(on)
                    ));
                }
            }
        }
        if let Some(a) = action {
            out.push_str(&format!("  -> {a:?}\n"));
        }
    }
    out
}
