//! A candidate's moves, through the shipped code: the campaign's decision and act
//! (`for_life/campaign.rs`), the keeper's checks, the heartbeat and the sidecar's step-down
//! (the pure core in `for_life/holder.rs`).

use std::{collections::VecDeque, time::Duration};

use super::{
    store::{Answer, Lock, Pid, PodRec, Req},
    Action, Down, Flight, Follower, ForLifeModel, Holder, Loss, Mutant, Proc, Why, Work, World,
};
use crate::{
    for_life::{
        decide::{
            dead_pod_to_delete, decide, defer_to_preferred, track_fate, Decision, Inputs, Policy, Proof,
            Stale, Waiting,
        },
        fencing::fencing_token_of,
        holder::{lock_loss, pod_ending, Beats, Liveness},
        record::{LeaderPod, LockRecord, PodRef},
        DeadLeaderPod,
    },
    leadership::LossReason,
    model::{at, tick},
};

/// The Pod a `PodRef` of the model names.
fn pid_of(p: &PodRef) -> Pid {
    let (slot, gen) = p.uid[1..].split_once('-').expect("p<slot>-<gen>");
    Pid {
        slot: slot.parse().expect("a slot"),
        gen: gen.parse().expect("a generation"),
    }
}

fn secs(t: u64) -> Duration {
    Duration::from_secs(t)
}

impl ForLifeModel {
    /// The lock as candidate `i` reads it (with [`Mutant::OwnByName`], a lock of its Pod's
    /// name is read as owned by its Pod).
    fn record(&self, w: &World, i: usize, lock: &Lock) -> LockRecord {
        let mut r = lock.record(&self.s);
        let me = w.cands[i].pid(i).pod_ref();
        if let (Mutant::OwnByName, Ok(o)) = (self.s.mutant, r.owner.as_mut()) {
            if o.name == me.name {
                o.uid = me.uid;
            }
        }
        r
    }

    /// Candidate `i`'s campaign takes in what it saw (the campaign's `track_leader_pod` and
    /// [`track_fate`]). Returns the slot of a leader Pod newly watched.
    fn refresh(&self, w: &World, i: usize, f: &mut Follower) -> Option<usize> {
        let me = w.cands[i].pid(i).pod_ref();
        let now = at(w.real + w.cands[i].skew);
        let record = f.lock.clone().flatten().map(|l| self.record(w, i, &l));
        let mut watched = None;
        if let Some(r) = &record {
            let wanted = r.owner.as_ref().ok().filter(|o| o.name != me.name).map(pid_of);
            match wanted {
                Some(p) if f.leader.as_ref().is_some_and(|(s, _)| *s == p.slot) => {}
                Some(p) => {
                    f.leader = Some((p.slot, LeaderPod::Unknown));
                    watched = Some(p.slot);
                }
                None => f.leader = None,
            }
        }
        let name = f.leader.as_ref().map(|(s, _)| format!("p{s}"));
        let leader = f.leader.as_ref().map(|(_, p)| p);
        track_fate(
            &mut f.fate,
            record.as_ref(),
            &me,
            name.as_deref().zip(leader),
            now,
        );
        watched
    }

    /// What candidate `i`'s campaign decides now (the shipped [`decide`], [`defer_to_preferred`]
    /// and [`dead_pod_to_delete`]), with the mutants around them.
    fn decision(&self, w: &World, i: usize, f: &Follower) -> (Decision, Option<PodRef>) {
        let me = w.cands[i].pid(i).pod_ref();
        let now = at(w.real + w.cands[i].skew);
        let record = f.lock.clone().flatten().map(|l| self.record(w, i, &l));
        let unknown = LeaderPod::Unknown;
        let inputs = Inputs {
            lock: record.as_ref(),
            leader_pod: f.leader.as_ref().map_or(&unknown, |(_, p)| p),
            node_not_ready_since: None,
            fate: f.fate.as_ref(),
            me: &me,
            now,
            policy: Policy {
                dead_leader_pod: DeadLeaderPod::DeleteEvicted,
                not_ready_takeover: None,
                kubelet_terminal_proof: false,
            },
        };
        let wait = secs(self.s.successor_wait);
        let mut decision = defer_to_preferred(decide(inputs), f.fate.as_ref(), &me, now, wait);
        let dead = dead_pod_to_delete(&inputs);
        match (self.s.mutant, &decision, &record) {
            (Mutant::NoProof, Decision::Wait { why, .. }, r) if may_run(why) => {
                decision = match r {
                    Some(r) => Decision::DeleteLock {
                        lock_uid: r.uid.clone(),
                        why: Stale::LeaderPodGone { holder: "?".into() },
                        proof: Proof::OptIn,
                        delete_pod: None,
                    },
                    None => Decision::Create,
                };
            }
            (Mutant::RecreatedAtOnce, _, None) => decision = Decision::Create,
            (Mutant::ForgetsOwnLock, Decision::Continue, _) => {
                decision = Decision::Wait {
                    why: Waiting::Leader { holder: me.name },
                    recheck_at: None,
                };
            }
            (Mutant::StalePreferred, Decision::DeleteLock { .. } | Decision::Create, _) => {
                if let Some((p, since)) = &f.stale_preferred {
                    if *p != me.name && now < at(*since) + wait {
                        decision = Decision::Wait {
                            why: Waiting::Leader { holder: p.clone() },
                            recheck_at: None,
                        };
                    }
                }
            }
            _ => {}
        }
        (decision, dead)
    }

    /// Whether candidate `i`'s campaign would act now (a timer or an event would make it).
    fn would_act(&self, w: &World, i: usize, f: &Follower) -> bool {
        let mut f = f.clone();
        self.refresh(w, i, &mut f);
        f.lock.is_some() && !matches!(self.decision(w, i, &f).0, Decision::Wait { .. })
    }

    /// What candidate `i` may do next.
    pub(super) fn cand_actions(&self, w: &World, i: usize, actions: &mut Vec<Action>) {
        let c = &w.cands[i];
        if !c.up() || c.dead {
            return;
        }
        match &c.flight {
            Some(f) if f.answer.is_none() => {
                actions.push(Action::Commit(i));
                if w.faults[5] < self.s.losses {
                    actions.extend([Action::LoseBefore(i), Action::LoseAfter(i)]);
                }
            }
            Some(_) => actions.push(Action::Answer(i)),
            None => {}
        }
        if !c.lock_q.is_empty() {
            actions.push(Action::WatchLock(i));
        }
        if !c.pod_q.is_empty() {
            actions.push(Action::WatchPod(i));
        }
        let now = w.real + c.skew;
        match &c.proc {
            Proc::Wait(f) if c.flight.is_none() && self.would_act(w, i, f) => {
                actions.push(Action::Attempt(i))
            }
            Proc::Lead(h) if h.lost.is_none() => {
                if h.beats.is_some() && c.flight.is_none() && now >= h.next_beat {
                    actions.push(Action::Beat(i));
                }
                if w.faults[6] < self.s.releases {
                    actions.push(Action::Release(i));
                }
            }
            Proc::Lead(_) if c.work.is_some() => actions.push(Action::StopWork(i)),
            Proc::Lead(h) if c.flight.is_none() && h.down.is_some() => actions.push(Action::StepDown(i)),
            _ => {}
        }
    }

    /// Every move.
    pub(super) fn step(&self, w: &mut World, action: Action) {
        let i = match action {
            Action::Commit(i) | Action::LoseAfter(i) => {
                let req = w.cands[i].flight.as_ref().expect("a request").req.clone();
                let mut answer = w.apply(&req);
                if let Action::LoseAfter(_) = action {
                    w.faults[5] += 1;
                    answer = Answer::Lost;
                }
                w.cands[i].flight.as_mut().expect("a request").answer = Some(answer);
                return;
            }
            Action::LoseBefore(i) => {
                w.faults[5] += 1;
                w.cands[i].flight.as_mut().expect("a request").answer = Some(Answer::Lost);
                return;
            }
            Action::Answer(i) => return self.answered(w, i),
            Action::WatchLock(i) => i,
            Action::WatchPod(i) => i,
            Action::Attempt(i) => return self.attempt(w, i),
            Action::Beat(i) => return self.beat(w, i),
            Action::StopWork(i) => {
                w.cands[i].work = None;
                if matches!(&w.cands[i].proc, Proc::Lead(h) if h.down.is_none()) {
                    self.done(w, i);
                }
                return;
            }
            Action::StepDown(i) => return self.step_down(w, i),
            Action::Release(i) => {
                w.faults[6] += 1;
                return self.lose(w, i, Loss::Released);
            }
            other => return self.world_step(w, other),
        };
        self.watched(w, i, action);
    }

    /// Candidate `i` takes in a watch event.
    fn watched(&self, w: &mut World, i: usize, action: Action) {
        let me = w.cands[i].pid(i).pod_ref();
        let (lock, pod) = match action {
            Action::WatchLock(_) => (w.cands[i].lock_q.pop_front(), None),
            _ => (None, w.cands[i].pod_q.pop_front()),
        };
        let proc = std::mem::replace(&mut w.cands[i].proc, Proc::Down);
        match proc {
            Proc::Lead(mut h) => {
                let loss = if h.lost.is_some() {
                    None
                } else if let Some(lock) = lock {
                    h.watched.clone_from(&lock);
                    let record = lock.map(|l| l.record(&self.s));
                    let uid = format!("lock-{}", h.lock_uid);
                    lock_loss(&uid, &me, record.as_ref()).map(|r| match r {
                        LossReason::LockDeleted => Loss::Deleted,
                        _ => Loss::Replaced,
                    })
                } else {
                    let (slot, p) = pod.expect("a Pod event");
                    let view = p.map(|p| p.view(slot, &self.s));
                    (slot == i && pod_ending(&me, view.as_ref()).is_some()).then_some(Loss::PodEnding)
                };
                w.cands[i].proc = Proc::Lead(h);
                if let Some(loss) = loss {
                    self.lose(w, i, loss);
                }
            }
            Proc::Wait(mut f) => {
                if let Some(lock) = lock {
                    f.lock = Some(lock);
                } else {
                    let (slot, p) = pod.expect("a Pod event");
                    let view = p.map(|p| p.view(slot, &self.s));
                    if slot == i && pod_ending(&me, view.as_ref()).is_some() {
                        // The campaign stops: this Pod is ending.
                        return;
                    }
                    if let Some((s, state)) = f.leader.as_mut().filter(|(s, _)| *s == slot) {
                        *state = PodRec::leader_pod(p.as_ref(), *s, &self.s);
                    }
                }
                self.track(w, i, f);
            }
            Proc::Down => unreachable!("a stopped process has no watch"),
        }
    }

    /// Candidate `i`'s campaign takes in what it saw, and watches a new leader Pod (its watch
    /// lists it).
    fn track(&self, w: &mut World, i: usize, mut f: Follower) {
        if let Some(slot) = self.refresh(w, i, &mut f) {
            let pod = w.pods[slot];
            w.cands[i].pod_q.push_back((slot, pod));
        }
        if self.s.mutant == Mutant::StalePreferred {
            if let Some(p) = f.fate.as_ref().and_then(|f| f.preferred.as_ref()) {
                f.stale_preferred = Some((p.0.clone(), w.real + w.cands[i].skew));
            }
        }
        w.cands[i].proc = Proc::Wait(f);
    }

    /// Candidate `i`'s campaign decides and acts.
    fn attempt(&self, w: &mut World, i: usize) {
        let Proc::Wait(mut f) = std::mem::replace(&mut w.cands[i].proc, Proc::Down) else {
            unreachable!("a campaign")
        };
        if let Some(slot) = self.refresh(w, i, &mut f) {
            w.cands[i].pod_q.push_back((slot, w.pods[slot]));
        }
        let (decision, dead) = self.decision(w, i, &f);
        let lock = f.lock.clone().flatten();
        let me = w.cands[i].pid(i);
        let now = w.real + w.cands[i].skew;
        // The fresh read of the leader Pod before a deletion, or a create after a lock that
        // went without its release mark.
        let confirm = match &decision {
            Decision::DeleteLock { .. } => true,
            Decision::Create => f.fate.as_ref().is_some_and(|f| !f.released),
            _ => false,
        };
        if let Some((slot, state)) = f.leader.as_mut().filter(|_| confirm) {
            let fresh = PodRec::leader_pod(w.pods[*slot].as_ref(), *slot, &self.s);
            if fresh != *state {
                *state = fresh;
                w.cands[i].proc = Proc::Wait(f);
                return;
            }
        }
        let (req, why) = match decision {
            Decision::Create => {
                if let Some(p) = dead {
                    f.dead = Some(pid_of(&p));
                }
                if self.s.mutant == Mutant::DeadPodFirst {
                    if let Some(p) = f.dead.take() {
                        w.apply(&Req::DeletePod(p));
                    }
                }
                let dead = f.dead;
                let lock = Lock {
                    uid: 0,
                    rv: 0,
                    owner: me,
                    released: false,
                    preferred: None,
                    beat: self.s.liveness.map(|_| 0),
                };
                (Req::Create(lock), Why::Create(dead))
            }
            Decision::Continue => {
                let lock = lock.expect("its own lock");
                let pre = lock.rv;
                let beat = self.s.liveness.is_some();
                let adopted = Lock { beat: None, ..lock };
                (
                    Req::Update {
                        lock: adopted,
                        pre,
                        beat,
                    },
                    Why::Adopt,
                )
            }
            Decision::DeleteLock {
                lock_uid,
                proof,
                delete_pod,
                ..
            } => {
                if let Some(p) = delete_pod {
                    f.dead = Some(pid_of(&p));
                }
                if self.s.mutant == Mutant::DeadPodFirst {
                    if let Some(p) = f.dead.take() {
                        w.apply(&Req::DeletePod(p));
                    }
                }
                let uid = lock_uid["lock-".len()..].parse().expect("a lock UID");
                let rv = matches!(proof, Proof::LivenessLapsed { .. })
                    .then(|| lock.as_ref().map(|l| l.rv))
                    .flatten();
                (Req::Delete { uid, rv }, Why::DeleteStale)
            }
            Decision::Wait { .. } => {
                w.cands[i].proc = Proc::Wait(f);
                return;
            }
        };
        w.cands[i].proc = Proc::Wait(f);
        w.cands[i].flight = Some(Flight {
            req,
            why,
            sent: now,
            answer: None,
        });
    }

    /// Candidate `i` wins a term on `lock` (as written), with the token given; `beat_sent`:
    /// when the write that made it, carrying the heartbeat, was sent (local tick).
    pub(super) fn win(
        &self,
        w: &mut World,
        i: usize,
        lock: Lock,
        token: u64,
        restarted: bool,
        beat_sent: Option<i64>,
    ) {
        let c = &mut w.cands[i];
        c.wins += 1;
        let token = match self.s.mutant {
            Mutant::TokenPerCandidate => u64::from(c.wins),
            _ => token,
        };
        if w.terms > 0 && (token < w.max_token || (!restarted && token == w.max_token)) {
            w.token_regressed = true;
        }
        w.terms = w.terms.saturating_add(1);
        w.max_token = w.max_token.max(token);
        w.ended = None;
        let liveness = self.s.liveness.map(|l| Liveness {
            confirm: secs(l),
            advertised: secs(l + self.s.cli_grace),
        });
        let beats = liveness.zip(beat_sent).map(|(l, sent)| Beats::new(l, at(sent)));
        let until =
            beats.map(|b| tick(b.confirmed_until()) + i64::try_from(self.s.cli_grace).expect("small"));
        c.work = Some(Work { token, until });
        c.proc = Proc::Lead(Holder {
            lock_uid: lock.uid,
            token,
            watched: Some(lock.clone()),
            current: lock,
            beats,
            next_beat: beats.map_or(0, |b| tick(b.first_due())),
            lost: None,
            down: None,
        });
        c.lock_q = VecDeque::from([w.lock.clone()]);
    }

    /// Candidate `i`'s term is lost: the step-down waits for the work to stop.
    pub(super) fn lose(&self, w: &mut World, i: usize, loss: Loss) {
        let Proc::Lead(h) = &mut w.cands[i].proc else {
            return;
        };
        if h.lost.is_some() {
            return;
        }
        h.lost = Some(loss);
        h.down = match loss {
            Loss::Deleted => Some(Down::SayStopped),
            Loss::Replaced => None,
            Loss::PodEnding | Loss::Released | Loss::Unconfirmed => Some(Down::Mark),
        };
        if h.down.is_none() && w.cands[i].work.is_none() {
            self.done(w, i);
        }
    }

    /// Candidate `i`'s step-down is over: with [`Settings::rejoin`](super::Settings::rejoin) it
    /// campaigns again, unless its Pod is ending; else it stops.
    pub(super) fn done(&self, w: &mut World, i: usize) {
        let c = &mut w.cands[i];
        let me = c.pid(i).pod_ref();
        let view = w.pods[i].map(|p| p.view(i, &self.s));
        if !self.s.rejoin || pod_ending(&me, view.as_ref()).is_some() {
            c.proc = Proc::Down;
            c.lock_q.clear();
            c.pod_q.clear();
            return;
        }
        c.proc = Proc::Wait(Follower::default());
        c.lock_q = VecDeque::from([w.lock.clone()]);
        c.pod_q = VecDeque::from([(i, w.pods[i])]);
    }

    /// Candidate `i`'s heartbeat: the lock as last known, renewed.
    fn beat(&self, w: &mut World, i: usize) {
        let now = w.real + w.cands[i].skew;
        let c = &mut w.cands[i];
        let Proc::Lead(h) = &c.proc else { unreachable!() };
        let req = Req::Update {
            lock: h.current.clone(),
            pre: h.current.rv,
            beat: true,
        };
        c.flight = Some(Flight {
            req,
            why: Why::Beat,
            sent: now,
            answer: None,
        });
    }
}

/// A wait for proof that an ended leader's work stopped.
fn may_run(why: &Waiting) -> bool {
    matches!(
        why,
        Waiting::LeaderMayRun { .. } | Waiting::LockDeletedUnderLeader { .. }
    )
}

/// The fencing token of a lock just created (the shipped `fencing_token_of`).
pub(super) fn created_token(l: &Lock, s: &super::Settings) -> u64 {
    fencing_token_of(&l.to_cm(s))
}
