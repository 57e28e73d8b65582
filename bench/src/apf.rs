//! API Priority and Fairness: the FlowSchema that sends the candidates' requests to the built-in
//! `leader-election` priority level, and what the API server's own metrics say about each
//! priority level over a window (seats in use against the limit, queues, rejections).
//!
//! The bench's `admin` is in `system:masters`, so its requests (the FlowSchema, the metrics) go
//! to the `exempt` level and never wait behind the load.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::api::flowcontrol::v1::{
    FlowDistinguisherMethod, FlowSchema, FlowSchemaSpec, PolicyRulesWithSubjects, PriorityLevelConfiguration,
    PriorityLevelConfigurationReference, ResourcePolicyRule, Subject, UserSubject,
};
use kube::{
    api::{DeleteParams, ObjectMeta, PostParams},
    Api, Client,
};
use tokio::task::JoinHandle;

/// The FlowSchema's name.
pub(crate) const FLOW_SCHEMA: &str = "kube-leader-bench";
/// The priority level it sends the candidates to: the one the control plane's own components
/// elect their leaders in (FlowSchema `system-leader-election`, precedence 100).
pub(crate) const PRIORITY_LEVEL: &str = "leader-election";
/// After `system-leader-election` (100), before `workload-leader-election` (200) and every
/// FlowSchema of ordinary users (`global-default`, 9900).
const PRECEDENCE: i32 = 150;

/// The FlowSchema: `users` (kind User) → [`PRIORITY_LEVEL`], for Leases, ConfigMaps and Pods
/// in `namespaces`, one flow per user.
pub(crate) fn flow_schema(users: &[String], namespaces: &[String]) -> FlowSchema {
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let rule = |group: &str, resources: &[&str]| ResourcePolicyRule {
        api_groups: vec![group.to_owned()],
        resources: strings(resources),
        verbs: vec!["*".into()],
        namespaces: Some(namespaces.to_vec()),
        cluster_scope: Some(false),
    };
    FlowSchema {
        metadata: ObjectMeta {
            name: Some(FLOW_SCHEMA.into()),
            ..ObjectMeta::default()
        },
        spec: Some(FlowSchemaSpec {
            matching_precedence: Some(PRECEDENCE),
            priority_level_configuration: PriorityLevelConfigurationReference {
                name: PRIORITY_LEVEL.into(),
            },
            distinguisher_method: Some(FlowDistinguisherMethod {
                type_: "ByUser".into(),
            }),
            rules: Some(vec![PolicyRulesWithSubjects {
                subjects: users
                    .iter()
                    .map(|u| Subject {
                        kind: "User".into(),
                        user: Some(UserSubject { name: u.clone() }),
                        ..Subject::default()
                    })
                    .collect(),
                resource_rules: Some(vec![
                    rule("coordination.k8s.io", &["leases"]),
                    rule("", &["configmaps", "pods"]),
                ]),
                non_resource_rules: None,
            }]),
        }),
        status: None,
    }
}

/// Creates (or replaces) the FlowSchema and waits until the API server's configuration
/// controller has taken it in (its `Dangling` condition is set to `False`).
pub(crate) async fn apply(admin: &Client, users: &[String], namespaces: &[String]) -> anyhow::Result<()> {
    let api = Api::<FlowSchema>::all(admin.clone());
    let _ = api.delete(FLOW_SCHEMA, &DeleteParams::default()).await;
    let fs = flow_schema(users, namespaces);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &fs).await {
            Ok(_) => break,
            // The deletion above may not be done yet.
            Err(kube::Error::Api(e)) if e.code == 409 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("create FlowSchema kube-leader-bench"),
        }
    }
    loop {
        let fs = api
            .get(FLOW_SCHEMA)
            .await
            .context("get FlowSchema kube-leader-bench")?;
        let dangling = fs
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_.as_deref() == Some("Dangling"));
        match dangling.and_then(|c| c.status) {
            Some(s) if s == "False" => return Ok(()),
            Some(s) if s == "True" => {
                anyhow::bail!("FlowSchema kube-leader-bench names a priority level that does not exist")
            }
            _ if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("the API server did not take in FlowSchema kube-leader-bench within 30 s")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Deletes the FlowSchema (nothing if it is gone).
pub(crate) async fn delete(admin: &Client) -> anyhow::Result<()> {
    match Api::<FlowSchema>::all(admin.clone())
        .delete(FLOW_SCHEMA, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e).context("delete FlowSchema kube-leader-bench"),
    }
}

/// A priority level's configuration, as the API server has it.
pub(crate) async fn describe_level(admin: &Client, name: &str) -> anyhow::Result<String> {
    let plc = Api::<PriorityLevelConfiguration>::all(admin.clone())
        .get(name)
        .await
        .with_context(|| format!("get PriorityLevelConfiguration {name}"))?;
    let Some(l) = plc.spec.and_then(|s| s.limited) else {
        return Ok(format!("`{name}`: not limited"));
    };
    let q = l.limit_response.as_ref().and_then(|r| r.queuing.as_ref());
    Ok(format!(
        "`{name}`: nominal concurrency shares {}, lendable {}%, borrowing limit {}, queues {} × hand size {} × \
         queue length {}",
        l.nominal_concurrency_shares.unwrap_or(30),
        l.lendable_percent.unwrap_or(0),
        l.borrowing_limit_percent
            .map_or("none".to_owned(), |b| format!("{b}%")),
        q.and_then(|q| q.queues).unwrap_or(0),
        q.and_then(|q| q.hand_size).unwrap_or(0),
        q.and_then(|q| q.queue_length_limit).unwrap_or(0),
    ))
}

// === the API server's APF metrics ===

/// One scrape of the `apiserver_flowcontrol_*` series that matter here.
#[derive(Debug, Clone, Default)]
struct Scrape {
    /// Gauges by priority level: nominal and current limit (seats), seats executing, requests
    /// waiting in queues.
    nominal: BTreeMap<String, f64>,
    limit: BTreeMap<String, f64>,
    executing: BTreeMap<String, f64>,
    in_queue: BTreeMap<String, f64>,
    /// Seats executing by FlowSchema.
    executing_by_schema: BTreeMap<String, f64>,
    /// Counters: dispatched by (flow schema, priority level); rejected by (priority level, reason).
    dispatched: BTreeMap<(String, String), f64>,
    rejected: BTreeMap<(String, String), f64>,
}

/// One metrics line's name, labels and value.
fn parse_line(line: &str) -> Option<(&str, BTreeMap<&str, &str>, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    let mut map = BTreeMap::new();
    // Label values here never hold `",` (names of levels, schemas and reasons).
    for pair in labels.split("\",").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once("=\"")?;
        map.insert(k.trim_start_matches(','), v.trim_end_matches('"'));
    }
    Some((name, map, value))
}

fn parse_scrape(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines().filter(|l| l.starts_with("apiserver_flowcontrol_")) {
        let Some((name, labels, v)) = parse_line(line) else {
            continue;
        };
        let pl = labels
            .get("priority_level")
            .copied()
            .unwrap_or_default()
            .to_owned();
        let fs = labels.get("flow_schema").copied().unwrap_or_default().to_owned();
        match name {
            "apiserver_flowcontrol_nominal_limit_seats" => {
                s.nominal.insert(pl, v);
            }
            "apiserver_flowcontrol_current_limit_seats" => {
                s.limit.insert(pl, v);
            }
            "apiserver_flowcontrol_current_executing_seats" => {
                *s.executing.entry(pl).or_default() += v;
                *s.executing_by_schema.entry(fs).or_default() += v;
            }
            "apiserver_flowcontrol_current_inqueue_requests" => {
                *s.in_queue.entry(pl).or_default() += v;
            }
            "apiserver_flowcontrol_dispatched_requests_total" => {
                *s.dispatched.entry((fs, pl)).or_default() += v;
            }
            "apiserver_flowcontrol_rejected_requests_total" => {
                let reason = labels.get("reason").copied().unwrap_or_default().to_owned();
                *s.rejected.entry((pl, reason)).or_default() += v;
            }
            _ => {}
        }
    }
    s
}

async fn scrape(admin: &Client) -> anyhow::Result<Scrape> {
    let request = kube::core::Request::new("").get("metrics", &Default::default())?;
    let text = admin.request_text(request).await.context("GET /metrics")?;
    Ok(parse_scrape(&text))
}

/// Mean and maximum of a series of samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MeanMax {
    pub(crate) mean: f64,
    pub(crate) max: f64,
}

impl MeanMax {
    fn of(v: &[f64]) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        Self {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            max: v.iter().copied().fold(f64::MIN, f64::max),
        }
    }
}

/// One priority level over a window.
#[derive(Debug, Clone, Default)]
pub(crate) struct Level {
    pub(crate) name: String,
    pub(crate) nominal_seats: f64,
    /// Its limit after lending and borrowing, sampled.
    pub(crate) limit_seats: MeanMax,
    pub(crate) executing_seats: MeanMax,
    pub(crate) in_queue: MeanMax,
    /// Requests dispatched in the window, by FlowSchema.
    pub(crate) dispatched: BTreeMap<String, u64>,
    /// Requests rejected (429) in the window, by reason (`queue-full`, `time-out`,
    /// `concurrency-limit`, `cancelled`).
    pub(crate) rejected: BTreeMap<String, u64>,
}

/// What the APF metrics and the machine's load average showed over a window.
#[derive(Debug, Clone, Default)]
pub(crate) struct ApfWindow {
    /// The levels with requests in the window (`exempt` left out: the bench's own).
    pub(crate) levels: Vec<Level>,
    /// Seats executing for our FlowSchema, sampled.
    pub(crate) bench_schema_seats: MeanMax,
    pub(crate) samples: usize,
    /// The 1-minute load average, sampled with the metrics: at the start, mean, max, at the end.
    pub(crate) load: LoadAverage,
}

/// The 1-minute load average over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LoadAverage {
    pub(crate) start: f64,
    pub(crate) mean: f64,
    pub(crate) max: f64,
    pub(crate) end: f64,
}

impl LoadAverage {
    pub(crate) fn label(&self) -> String {
        format!(
            "{:.1} at the start, mean {:.1}, max {:.1}, {:.1} at the end",
            self.start, self.mean, self.max, self.end
        )
    }
}

/// The 1-minute load average now.
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Scrapes the API server's APF metrics (and the load average) every `every` until closed.
pub(crate) struct Sampler {
    first: Scrape,
    samples: Arc<Mutex<Vec<Scrape>>>,
    loads: Arc<Mutex<Vec<f64>>>,
    task: JoinHandle<()>,
    admin: Client,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

impl Sampler {
    pub(crate) async fn start(admin: &Client, every: Duration) -> anyhow::Result<Self> {
        let first = scrape(admin).await?;
        let samples: Arc<Mutex<Vec<Scrape>>> = Arc::default();
        let loads = Arc::new(Mutex::new(vec![load_average()]));
        let task = {
            let (admin, samples, loads) = (admin.clone(), samples.clone(), loads.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    loads
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(load_average());
                    if let Ok(s) = scrape(&admin).await {
                        samples.lock().unwrap_or_else(|p| p.into_inner()).push(s);
                    }
                }
            })
        };
        Ok(Self {
            first,
            samples,
            loads,
            task,
            admin: admin.clone(),
        })
    }

    /// Stops sampling and sums up the window.
    pub(crate) async fn close(self) -> ApfWindow {
        self.task.abort();
        let last = scrape(&self.admin).await.ok();
        let mut samples = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        let mut loads = std::mem::take(&mut *self.loads.lock().unwrap_or_else(|p| p.into_inner()));
        loads.push(load_average());
        if let Some(l) = &last {
            samples.push(l.clone());
        }
        let last = samples.last().cloned().unwrap_or_else(|| self.first.clone());
        let delta = |now: &BTreeMap<(String, String), f64>, then: &BTreeMap<(String, String), f64>| {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        (v - then.get(k).copied().unwrap_or(0.0)).max(0.0) as u64,
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect::<BTreeMap<_, _>>()
        };
        let dispatched = delta(&last.dispatched, &self.first.dispatched);
        let rejected = delta(&last.rejected, &self.first.rejected);
        let mut names: Vec<String> = dispatched
            .keys()
            .map(|(_, pl)| pl.clone())
            .chain(rejected.keys().map(|(pl, _)| pl.clone()))
            .filter(|pl| pl != "exempt")
            .collect();
        names.sort();
        names.dedup();
        let series = |f: &dyn Fn(&Scrape) -> Option<f64>| -> MeanMax {
            MeanMax::of(&samples.iter().filter_map(f).collect::<Vec<_>>())
        };
        let levels = names
            .into_iter()
            .map(|name| Level {
                nominal_seats: last.nominal.get(&name).copied().unwrap_or(0.0),
                limit_seats: series(&|s| s.limit.get(&name).copied()),
                executing_seats: series(&|s| Some(s.executing.get(&name).copied().unwrap_or(0.0))),
                in_queue: series(&|s| Some(s.in_queue.get(&name).copied().unwrap_or(0.0))),
                dispatched: dispatched
                    .iter()
                    .filter(|((_, pl), _)| *pl == name)
                    .map(|((fs, _), n)| (fs.clone(), *n))
                    .collect(),
                rejected: rejected
                    .iter()
                    .filter(|((pl, _), _)| *pl == name)
                    .map(|((_, reason), n)| (reason.clone(), *n))
                    .collect(),
                name,
            })
            .collect();
        let load = LoadAverage {
            start: loads.first().copied().unwrap_or(0.0),
            mean: MeanMax::of(&loads).mean,
            max: MeanMax::of(&loads).max,
            end: loads.last().copied().unwrap_or(0.0),
        };
        ApfWindow {
            levels,
            bench_schema_seats: series(&|s| {
                Some(s.executing_by_schema.get(FLOW_SCHEMA).copied().unwrap_or(0.0))
            }),
            samples: samples.len(),
            load,
        }
    }
}

impl ApfWindow {
    /// One line per priority level, for the report.
    pub(crate) fn describe(&self) -> Vec<String> {
        self.levels
            .iter()
            .map(|l| {
                let dispatched: Vec<String> = l.dispatched.iter().map(|(fs, n)| format!("{fs} {n}")).collect();
                let rejected: Vec<String> = l.rejected.iter().map(|(r, n)| format!("{r} {n}")).collect();
                format!(
                    "`{}`: nominal {:.0} seats, limit mean {:.0} (max {:.0}); executing seats mean {:.1}, max {:.0}; \
                     queued requests mean {:.1}, max {:.0}; dispatched by FlowSchema: {}; rejected (429): {}",
                    l.name,
                    l.nominal_seats,
                    l.limit_seats.mean,
                    l.limit_seats.max,
                    l.executing_seats.mean,
                    l.executing_seats.max,
                    l.in_queue.mean,
                    l.in_queue.max,
                    if dispatched.is_empty() { "none".into() } else { dispatched.join(", ") },
                    if rejected.is_empty() { "none".into() } else { rejected.join(", ") },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flow_schema_names_the_users_and_the_level() {
        let fs = flow_schema(&["user-3".into()], &["kl-a".into()]);
        let spec = fs.spec.unwrap();
        assert_eq!(spec.priority_level_configuration.name, "leader-election");
        assert_eq!(spec.matching_precedence, Some(150));
        let rules = &spec.rules.unwrap()[0];
        assert_eq!(rules.subjects[0].user.as_ref().unwrap().name, "user-3");
        let resources = rules.resource_rules.as_ref().unwrap();
        assert_eq!(resources[0].resources, ["leases"]);
        assert_eq!(resources[1].resources, ["configmaps", "pods"]);
        assert_eq!(resources[0].namespaces.as_deref(), Some(&["kl-a".to_owned()][..]));
    }

    #[test]
    fn parses_the_flowcontrol_series() {
        let text = r#"# HELP x
apiserver_flowcontrol_nominal_limit_seats{priority_level="leader-election"} 25
apiserver_flowcontrol_current_limit_seats{priority_level="leader-election"} 25
apiserver_flowcontrol_current_executing_seats{flow_schema="kube-leader-bench",priority_level="leader-election"} 3
apiserver_flowcontrol_current_executing_seats{flow_schema="system-leader-election",priority_level="leader-election"} 1
apiserver_flowcontrol_current_inqueue_requests{flow_schema="global-default",priority_level="global-default"} 7
apiserver_flowcontrol_dispatched_requests_total{flow_schema="kube-leader-bench",priority_level="leader-election"} 1234
apiserver_flowcontrol_rejected_requests_total{flow_schema="global-default",priority_level="global-default",reason="time-out"} 5
apiserver_request_total{code="200"} 9
"#;
        let s = parse_scrape(text);
        assert_eq!(s.nominal["leader-election"], 25.0);
        assert_eq!(s.executing["leader-election"], 4.0);
        assert_eq!(s.executing_by_schema["kube-leader-bench"], 3.0);
        assert_eq!(s.in_queue["global-default"], 7.0);
        assert_eq!(
            s.dispatched[&("kube-leader-bench".to_owned(), "leader-election".to_owned())],
            1234.0
        );
        assert_eq!(
            s.rejected[&("global-default".to_owned(), "time-out".to_owned())],
            5.0
        );
    }
}
