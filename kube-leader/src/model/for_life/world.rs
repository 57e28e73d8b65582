//! The world's moves: real time, the kubelet, the garbage collector and the faults; the
//! candidates' own moves are in [`super::cand`].

use std::collections::VecDeque;

use super::{
    store::{Lock, Pid, PodRec},
    Action, Cand, Follower, ForLifeModel, Loss, Proc, World,
};
use crate::model::skews;

impl Cand {
    /// A process just started in Pod generation `gen`, campaigning.
    pub(super) fn fresh(gen: u8, skew: i64) -> Self {
        Self {
            gen,
            skew,
            proc: Proc::Wait(Follower::default()),
            work: None,
            lock_q: VecDeque::new(),
            pod_q: VecDeque::new(),
            flight: None,
            orphan: None,
            kill_by: None,
            dead: false,
            crashed: false,
            wins: 0,
        }
    }
}

impl ForLifeModel {
    /// p0 leads on the lock it created (revision 1, token 1); every other candidate campaigns,
    /// its watches about to list the lock and its own Pod.
    pub(super) fn initial(&self) -> World {
        let n = self.s.candidates;
        let lock = Lock {
            uid: 1,
            rv: 1,
            owner: Pid { slot: 0, gen: 0 },
            released: false,
            preferred: None,
            beat: self.s.liveness.map(|_| 1),
        };
        let pod = PodRec {
            gen: 0,
            evicted: false,
            deleting: false,
        };
        let mut w = World {
            real: 0,
            grace: self.s.pod_grace,
            lock: Some(lock.clone()),
            pods: vec![Some(pod); n],
            revision: 1,
            cands: (0..n).map(|_| Cand::fresh(0, 0)).collect(),
            faults: [0; 8],
            terms: 0,
            max_token: 0,
            token_regressed: false,
            ended: None,
        };
        for i in 1..n {
            w.cands[i].lock_q.push_back(Some(lock.clone()));
            w.cands[i].pod_q.push_back((i, Some(pod)));
        }
        let beat = self.s.liveness.map(|_| 0);
        self.win(&mut w, 0, lock, 1, false, beat);
        w
    }

    /// Whether candidate `i`'s work may run now (see the module docs).
    pub(super) fn allowed(&self, w: &World, i: usize) -> bool {
        let c = &w.cands[i];
        let now = w.real + c.skew;
        !c.dead
            && c.work
                .as_ref()
                .is_some_and(|work| work.until.is_none_or(|u| now < u))
    }

    /// Whether candidate `i` is live: its process runs, in a Pod that is not ending.
    fn live(w: &World, i: usize) -> bool {
        let c = &w.cands[i];
        c.up() && !c.dead && w.pods[i].is_some_and(|p| p.gen == c.gen && !p.evicted && !p.deleting)
    }

    /// The leader ended (`crash_only`: by a crash) more than the bound ago, nobody leads since,
    /// and a live candidate remains.
    pub(super) fn leaderless_past(&self, w: &World, crash_only: bool) -> bool {
        let late = w
            .ended
            .is_some_and(|(at, crash)| (crash || !crash_only) && w.real - at > self.s.failover_bound());
        late && (0..w.cands.len()).any(|i| Self::live(w, i))
    }

    /// What the world may do next: time, the kubelet, the garbage collector, the faults.
    pub(super) fn world_actions(&self, w: &World, actions: &mut Vec<Action>) {
        let s = &self.s;
        let killing = w
            .cands
            .iter()
            .any(|c| !c.dead && c.kill_by.is_some_and(|k| w.real >= k));
        if w.real < s.horizon && !killing {
            let now: Vec<i64> = w.cands.iter().map(|c| c.skew).collect();
            for v in skews(w.cands.len(), s.drift, &now) {
                actions.push(Action::Tick(v));
            }
        }
        if let Some(l) = &w.lock {
            if w.pods[l.owner.slot].is_none_or(|p| p.gen != l.owner.gen) {
                actions.push(Action::Collect);
            }
            if w.faults[7] < s.lock_deletes {
                actions.push(Action::DeleteLock);
            }
        }
        for (i, c) in w.cands.iter().enumerate() {
            let pod = w.pods[i].filter(|p| p.gen == c.gen);
            let running = pod.is_some_and(|p| !p.evicted && !p.deleting);
            let pushes = [
                (running && w.faults[1] < s.evictions, Action::Evict(i)),
                (running && w.faults[2] < s.deletions, Action::DeletePod(i)),
                (pod.is_some() && w.faults[3] < s.forced, Action::ForceDelete(i)),
                (c.kill_by.is_some() && !c.dead, Action::Kill(i)),
                (pod.is_some_and(|p| p.deleting) && c.dead, Action::Vanish(i)),
                (
                    w.pods[i].is_none() && c.dead && w.faults[4] < s.recreations,
                    Action::Recreate(i),
                ),
                (
                    c.up() && w.faults[0] < s.crashes && (!s.prompt || matches!(c.proc, Proc::Lead(_))),
                    Action::Crash(i),
                ),
                (c.crashed && running, Action::Restart(i)),
                (c.orphan.is_some(), Action::Orphan(i)),
            ];
            actions.extend(pushes.into_iter().filter(|(on, _)| *on).map(|(_, a)| a));
        }
    }

    /// The world's moves.
    pub(super) fn world_step(&self, w: &mut World, action: Action) {
        match action {
            Action::Tick(skews) => {
                w.real += 1;
                for (c, s) in w.cands.iter_mut().zip(skews) {
                    c.skew = s;
                }
                for i in 0..w.cands.len() {
                    let c = &mut w.cands[i];
                    let now = w.real + c.skew;
                    if c.work
                        .as_ref()
                        .is_some_and(|wk| wk.until.is_some_and(|u| now >= u))
                    {
                        // The supervisor's deadline: COMMAND is stopped.
                        c.work = None;
                        self.lose(w, i, Loss::Unconfirmed);
                    }
                }
            }
            Action::Collect | Action::DeleteLock => {
                if action == Action::DeleteLock {
                    w.faults[7] += 1;
                }
                w.revision += 1;
                w.set_lock(None);
            }
            Action::Evict(i) | Action::DeletePod(i) => {
                w.faults[if action == Action::Evict(i) { 1 } else { 2 }] += 1;
                self.leader_ends(w, i, false);
                w.end_pod(i, action == Action::DeletePod(i));
            }
            Action::ForceDelete(i) => {
                w.faults[3] += 1;
                self.leader_ends(w, i, false);
                w.set_pod(i, None);
                w.kill_by(i);
            }
            Action::Kill(i) => {
                let c = &mut w.cands[i];
                c.dead = true;
                Self::stop_process(c);
            }
            Action::Vanish(i) => w.set_pod(i, None),
            Action::Recreate(i) => {
                w.faults[4] += 1;
                let gen = w.cands[i].gen + 1;
                w.cands[i] = Cand::fresh(gen, w.cands[i].skew);
                w.cands[i].lock_q.push_back(w.lock.clone());
                let pod = PodRec {
                    gen,
                    evicted: false,
                    deleting: false,
                };
                w.set_pod(i, Some(pod));
            }
            Action::Crash(i) => {
                w.faults[0] += 1;
                self.leader_ends(w, i, true);
                let c = &mut w.cands[i];
                c.crashed = true;
                Self::stop_process(c);
            }
            Action::Restart(i) => {
                let (lock, pod) = (w.lock.clone(), w.pods[i]);
                let c = &mut w.cands[i];
                c.crashed = false;
                c.proc = Proc::Wait(Follower::default());
                c.lock_q = VecDeque::from([lock]);
                c.pod_q = VecDeque::from([(i, pod)]);
            }
            Action::Orphan(i) => {
                let req = w.cands[i].orphan.take().expect("an orphan");
                w.apply(&req);
            }
            _ => unreachable!("a candidate's move: {action:?}"),
        }
    }

    /// Candidate `i`'s process stops (a crash, or the kubelet's kill): its work with it; its
    /// request in flight may still commit.
    fn stop_process(c: &mut Cand) {
        c.proc = Proc::Down;
        c.work = None;
        c.orphan = c.flight.take().filter(|f| f.answer.is_none()).map(|f| f.req);
        c.lock_q.clear();
        c.pod_q.clear();
    }

    /// In a fair world: candidate `i`'s Pod ends or its process crashes; if it leads, the
    /// failover clock starts.
    fn leader_ends(&self, w: &mut World, i: usize, crash: bool) {
        let leads = matches!(&w.cands[i].proc, Proc::Lead(h) if h.lost.is_none());
        if self.s.prompt && leads && w.ended.is_none() {
            w.ended = Some((w.real, crash));
        }
    }
}
