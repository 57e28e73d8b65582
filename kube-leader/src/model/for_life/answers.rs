//! A candidate takes in the answer to its request, as the campaign, the heartbeat and the
//! step-down do; and the sidecar's step-down writes.

use super::{
    cand::created_token,
    store::{Answer, Lock, Req},
    Down, Flight, ForLifeModel, Loss, Proc, Why, World,
};
use crate::{
    for_life::holder::{lock_loss, release_mark, restart_token, Mark},
    leadership::LossReason,
    model::{at, tick},
};

impl ForLifeModel {
    /// Candidate `i` takes in the answer to its request.
    pub(super) fn answered(&self, w: &mut World, i: usize) {
        let f = w.cands[i].flight.take().expect("a request");
        let answer = f.answer.clone().expect("an answer");
        let beat_sent = self.s.liveness.map(|_| f.sent);
        match (f.why, answer) {
            (Why::Create(dead), Answer::Ok(Some(l))) => {
                // The campaign deletes the last leader's dead Pod once its create won.
                if let Some(p) = dead {
                    w.apply(&Req::DeletePod(p));
                }
                let token = created_token(&l, &self.s);
                self.win(w, i, l, token, false, beat_sent);
            }
            (Why::DeleteStale, Answer::Ok(_) | Answer::NotFound) => {
                if let Proc::Wait(fl) = &mut w.cands[i].proc {
                    fl.lock = Some(None);
                    if let Some(fate) = fl.fate.as_mut() {
                        fate.proven = true;
                    }
                }
            }
            (Why::Adopt, Answer::Ok(Some(l))) => {
                let Req::Update {
                    lock: before, pre, ..
                } = &f.req
                else {
                    unreachable!()
                };
                let mut before = before.clone();
                before.rv = *pre;
                let (token, _) = restart_token(&before.record(&self.s));
                self.win(w, i, l, token, true, beat_sent);
            }
            (Why::Beat, answer) => self.beat_answered(w, i, f.sent, answer),
            (Why::Reread, answer) => self.reread(w, i, f.sent, answer),
            (Why::Mark, answer) => {
                let Proc::Lead(h) = &mut w.cands[i].proc else {
                    return;
                };
                match answer {
                    Answer::Ok(_) => h.down = Some(Down::Delete),
                    Answer::NotFound => self.done(w, i),
                    Answer::Conflict | Answer::Lost => h.watched = None,
                }
            }
            (Why::Delete | Why::SayStopped, Answer::Lost) => {}
            (Why::Delete | Why::SayStopped, _) => self.done(w, i),
            _ => {}
        }
    }

    /// A heartbeat's answer: the term confirmed from its send, or the lock re-read after a
    /// conflict.
    fn beat_answered(&self, w: &mut World, i: usize, sent: i64, answer: Answer) {
        let now = w.real + w.cands[i].skew;
        let grace = i64::try_from(self.s.cli_grace).expect("small");
        let c = &mut w.cands[i];
        let Proc::Lead(h) = &mut c.proc else { return };
        let Some(b) = h.beats.as_mut() else { return };
        match answer {
            Answer::Ok(Some(l)) => {
                let until = b.written(at(sent));
                h.current = l;
                h.next_beat = tick(b.next_due(at(sent), at(now)));
                if let (None, Some(work)) = (h.lost, c.work.as_mut()) {
                    work.until = Some(tick(until) + grace);
                }
            }
            Answer::Conflict | Answer::NotFound => {
                c.flight = Some(Flight {
                    req: Req::Get,
                    why: Why::Reread,
                    sent: now,
                    answer: None,
                });
            }
            _ => h.next_beat = tick(b.next_due(at(sent), at(now))),
        }
    }

    /// A re-read of the lock: by the heartbeat (still the term's?), or by the release's mark.
    fn reread(&self, w: &mut World, i: usize, sent: i64, answer: Answer) {
        let now = w.real + w.cands[i].skew;
        let me = w.cands[i].pid(i).pod_ref();
        let Proc::Lead(h) = &mut w.cands[i].proc else {
            return;
        };
        let Answer::Ok(lock) = answer else {
            if let Some(b) = &h.beats {
                h.next_beat = tick(b.next_due(at(sent), at(now)));
            }
            return;
        };
        if h.lost.is_some() {
            if lock.is_none() {
                return self.done(w, i);
            }
            h.watched = lock;
            return;
        }
        let record = lock.as_ref().map(|l| l.record(&self.s));
        let uid = format!("lock-{}", h.lock_uid);
        match lock_loss(&uid, &me, record.as_ref()) {
            Some(LossReason::LockDeleted) => self.lose(w, i, Loss::Deleted),
            Some(_) => self.lose(w, i, Loss::Replaced),
            None => {
                h.current = lock.expect("the term's lock");
                h.next_beat = now;
            }
        }
    }

    /// Candidate `i`'s sidecar steps down once its work stopped: the release's mark and
    /// deletion, or the lock created again marked released after a deletion under it.
    pub(super) fn step_down(&self, w: &mut World, i: usize) {
        let now = w.real + w.cands[i].skew;
        let me = w.cands[i].pid(i);
        let successor = self.s.successor.then(|| (i + 1) % w.cands.len());
        let Proc::Lead(h) = &mut w.cands[i].proc else {
            unreachable!()
        };
        let uid = format!("lock-{}", h.lock_uid);
        let (req, why) = match h.down.expect("a step-down") {
            Down::Mark => match &h.watched {
                None => (Req::Get, Why::Reread),
                Some(l) => match release_mark(&uid, &me.pod_ref(), &l.record(&self.s)) {
                    Mark::NotMine => return self.done(w, i),
                    Mark::Marked => {
                        h.down = Some(Down::Delete);
                        (
                            Req::Delete {
                                uid: h.lock_uid,
                                rv: None,
                            },
                            Why::Delete,
                        )
                    }
                    Mark::Write => {
                        let lock = Lock {
                            released: true,
                            preferred: successor,
                            ..l.clone()
                        };
                        let pre = l.rv;
                        (
                            Req::Update {
                                lock,
                                pre,
                                beat: false,
                            },
                            Why::Mark,
                        )
                    }
                },
            },
            Down::Delete => (
                Req::Delete {
                    uid: h.lock_uid,
                    rv: None,
                },
                Why::Delete,
            ),
            Down::SayStopped => {
                let lock = Lock {
                    uid: 0,
                    rv: 0,
                    owner: me,
                    released: true,
                    preferred: successor,
                    beat: None,
                };
                (Req::Create(lock), Why::SayStopped)
            }
        };
        w.cands[i].flight = Some(Flight {
            req,
            why,
            sent: now,
            answer: None,
        });
    }
}
