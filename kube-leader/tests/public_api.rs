//! The public API, one item per line, must equal the snapshot in `tests/public-api.txt`.
//!
//! A change of the public API then shows in review as a diff of that file, and the semver
//! policy (docs/development.md) decides the version. `cargo semver-checks` needs a published
//! baseline; until there is one, this snapshot is the check.
//!
//! The API comes from rustdoc's JSON output (`--output-format json`, every feature enabled), built
//! on the stable toolchain with `RUSTC_BOOTSTRAP=1` into a target directory of its own
//! (`target/tmp/public-api`, or `KUBE_LEADER_PUBLIC_API_TARGET_DIR`, which the test command
//! points at a directory shared between checkouts; the first run builds the dependencies'
//! metadata there once). Each public item is written with
//! its full path: modules, structs with their public fields, enums with their variants, functions
//! and methods with their signatures, constants, type aliases, traits, and every trait a type
//! implements (auto traits included: losing `Send` is a breaking change). Blanket impls are left
//! out: they follow from the others.
//!
//! After an intended change: `KUBE_LEADER_BLESS=1 cargo test -p kube-leader --test public_api`,
//! then review the diff of `tests/public-api.txt`.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/public-api.txt");

#[test]
fn public_api_matches_the_snapshot() {
    let json = rustdoc_json();
    let api = render(&json);
    let path = Path::new(SNAPSHOT);
    if std::env::var_os("KUBE_LEADER_BLESS").is_some() {
        std::fs::write(path, &api).unwrap();
        eprintln!("wrote {SNAPSHOT}: review its diff");
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    if expected == api {
        return;
    }
    let old: BTreeSet<&str> = expected.lines().collect();
    let new: BTreeSet<&str> = api.lines().collect();
    let mut diff = String::new();
    for gone in old.difference(&new) {
        let _ = writeln!(diff, "- {gone}");
    }
    for added in new.difference(&old) {
        let _ = writeln!(diff, "+ {added}");
    }
    panic!(
        "the public API of kube-leader changed (- removed, + added):\n{diff}\n\
         If this is intended, decide the version by the semver policy (docs/development.md), \
         note it in CHANGELOG.md, and accept it with\n  \
         KUBE_LEADER_BLESS=1 cargo test -p kube-leader --test public_api"
    );
}

/// Builds rustdoc's JSON for this crate and reads it.
fn rustdoc_json() -> Value {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("KUBE_LEADER_PUBLIC_API_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_TARGET_TMPDIR")).join("public-api"),
        PathBuf::from,
    );
    forget_this_crate(&target);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(manifest)
        // Every feature: an optional module is public API too.
        .args(["rustdoc", "--quiet", "--lib", "--all-features", "--manifest-path"])
        .arg(manifest.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        // rustdoc's JSON output is unstable: allowed on the stable toolchain by this variable.
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo rustdoc --output-format json failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = target.join("doc/kube_leader.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).unwrap()
}

/// Drops this crate's fingerprints and JSON from `target`, so that cargo documents this
/// checkout: in a directory shared between checkouts, another checkout's build writes the same
/// `doc/kube_leader.json`, and cargo, finding this checkout's fingerprint fresh, would not
/// write it again. The dependencies' metadata stays.
fn forget_this_crate(target: &Path) {
    let _ = std::fs::remove_file(target.join("doc/kube_leader.json"));
    let Ok(entries) = std::fs::read_dir(target.join("debug/.fingerprint")) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with("kube-leader-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

// === rendering ===

/// The crate's public API, one sorted line per item.
fn render(doc: &Value) -> String {
    let mut r = Renderer {
        doc,
        public: HashMap::new(),
    };
    // Pass 1: every public path of every item. An item defined in a private module and
    // re-exported is reachable only through its re-exports.
    let root = doc["root"].to_string();
    let mut reach: HashMap<String, Vec<String>> = HashMap::new();
    r.reach(&root, "kube_leader", &mut reach);
    // Its canonical path is the most specific one (`kube_leader::for_life::ForLife` rather than
    // the crate root's `kube_leader::ForLife`); the others are re-exports of it.
    for (id, paths) in &mut reach {
        paths.sort_by(|a, b| {
            b.matches("::")
                .count()
                .cmp(&a.matches("::").count())
                .then(a.cmp(b))
        });
        r.public.insert(id.clone(), paths[0].clone());
    }
    // Pass 2: each item once, at its canonical path; a line per re-export.
    let mut lines = BTreeSet::new();
    let mut ids: Vec<(&String, &Vec<String>)> = reach.iter().collect();
    ids.sort();
    for (id, paths) in ids {
        if let Some(source) = id.strip_prefix("extern ") {
            for p in paths {
                lines.insert(format!("pub use {p} = {source}"));
            }
            continue;
        }
        let canonical = &paths[0];
        for alias in &paths[1..] {
            lines.insert(format!("pub use {alias} = {canonical}"));
        }
        if r.item(id)["inner"].get("module").is_some() {
            lines.insert(format!("pub mod {canonical}"));
        } else {
            r.definition(id, canonical, &mut lines);
        }
    }
    let mut out = String::new();
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

struct Renderer<'a> {
    doc: &'a Value,
    /// The canonical public path of each item of this crate.
    public: HashMap<String, String>,
}

impl Renderer<'_> {
    fn item(&self, id: &str) -> &Value {
        &self.doc["index"][id]
    }

    /// Records where the public items of module `id` (at `path`) can be named from.
    fn reach(&self, id: &str, path: &str, reach: &mut HashMap<String, Vec<String>>) {
        let module = &self.item(id)["inner"]["module"];
        for child in module["items"].as_array().into_iter().flatten() {
            let cid = child.to_string();
            let item = self.item(&cid);
            if item["visibility"] != "public" {
                continue;
            }
            if let Some(u) = item["inner"].get("use") {
                let alias = u["name"].as_str().unwrap_or_default();
                let Some(target) = u["id"].as_u64().map(|t| t.to_string()) else {
                    continue;
                };
                if self.item(&target).is_null() {
                    // A re-export from another crate.
                    let source = self.path_of(&target, u["source"].as_str().unwrap_or_default());
                    reach
                        .entry(format!("extern {source}"))
                        .or_default()
                        .push(format!("{path}::{alias}"));
                    continue;
                }
                if u["is_glob"] == true {
                    self.reach(&target, path, reach);
                    continue;
                }
                let here = format!("{path}::{alias}");
                reach.entry(target.clone()).or_default().push(here.clone());
                if self.item(&target)["inner"].get("module").is_some() {
                    self.reach(&target, &here, reach);
                }
            } else {
                let here = format!("{path}::{}", item["name"].as_str().unwrap_or_default());
                reach.entry(cid.clone()).or_default().push(here.clone());
                if item["inner"].get("module").is_some() {
                    self.reach(&cid, &here, reach);
                }
            }
        }
    }

    fn attrs(&self, item: &Value) -> String {
        let mut s = String::new();
        for a in item["attrs"].as_array().into_iter().flatten() {
            if a == "non_exhaustive" {
                s.push_str("#[non_exhaustive] ");
            } else if a.get("must_use").is_some() {
                s.push_str("#[must_use] ");
            }
        }
        s
    }

    fn definition(&self, id: &str, here: &str, out: &mut BTreeSet<String>) {
        let item = self.item(id);
        let inner = &item["inner"];
        let attrs = self.attrs(item);
        if let Some(s) = inner.get("struct") {
            let g = self.generics(&s["generics"]);
            let kind = &s["kind"];
            let stripped = if kind.to_string().contains("\"has_stripped_fields\":true") {
                " { /* private fields */ }"
            } else {
                ""
            };
            out.insert(format!("{attrs}pub struct {here}{}{stripped}{}", g.0, g.1));
            let fields = kind["plain"]["fields"]
                .as_array()
                .or_else(|| kind["tuple"].as_array())
                .cloned()
                .unwrap_or_default();
            for (i, f) in fields.iter().enumerate() {
                if f.is_null() {
                    continue;
                }
                let field = self.item(&f.to_string());
                if field["visibility"] != "public" {
                    continue;
                }
                let name = field["name"]
                    .as_str()
                    .map_or_else(|| i.to_string(), str::to_string);
                out.insert(format!(
                    "pub {here}::{name}: {}",
                    self.ty(&field["inner"]["struct_field"])
                ));
            }
            self.impls(&s["impls"], here, out);
        } else if let Some(e) = inner.get("enum") {
            let g = self.generics(&e["generics"]);
            out.insert(format!("{attrs}pub enum {here}{}{}", g.0, g.1));
            for v in e["variants"].as_array().into_iter().flatten() {
                let variant = self.item(&v.to_string());
                let name = variant["name"].as_str().unwrap_or_default();
                let vattrs = self.attrs(variant);
                let kind = &variant["inner"]["variant"]["kind"];
                let shape = if let Some(t) = kind.get("tuple") {
                    let fields: Vec<String> = t
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| {
                            if f.is_null() {
                                "_".into()
                            } else {
                                self.ty(&self.item(&f.to_string())["inner"]["struct_field"])
                            }
                        })
                        .collect();
                    format!("({})", fields.join(", "))
                } else if let Some(s) = kind.get("struct") {
                    let fields: Vec<String> = s["fields"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| {
                            let field = self.item(&f.to_string());
                            format!(
                                "{}: {}",
                                field["name"].as_str().unwrap_or_default(),
                                self.ty(&field["inner"]["struct_field"])
                            )
                        })
                        .collect();
                    let more = if s["has_stripped_fields"] == true {
                        ", .."
                    } else {
                        ""
                    };
                    format!(" {{ {}{more} }}", fields.join(", "))
                } else {
                    String::new()
                };
                out.insert(format!("{vattrs}{here}::{name}{shape}"));
            }
            self.impls(&e["impls"], here, out);
        } else if let Some(f) = inner.get("function") {
            out.insert(format!("{attrs}{}", self.function(f, here)));
        } else if let Some(c) = inner.get("constant") {
            out.insert(format!(
                "pub const {here}: {} = {}",
                self.ty(&c["type"]),
                c["const"]["expr"].as_str().unwrap_or("_")
            ));
        } else if let Some(t) = inner.get("type_alias") {
            let g = self.generics(&t["generics"]);
            out.insert(format!("pub type {here}{}{} = {}", g.0, g.1, self.ty(&t["type"])));
        } else if let Some(t) = inner.get("trait") {
            let g = self.generics(&t["generics"]);
            let bounds = self.bounds(&t["bounds"]);
            let bounds = if bounds.is_empty() {
                String::new()
            } else {
                format!(": {bounds}")
            };
            out.insert(format!("{attrs}pub trait {here}{}{bounds}{}", g.0, g.1));
            for i in t["items"].as_array().into_iter().flatten() {
                let ti = self.item(&i.to_string());
                let name = ti["name"].as_str().unwrap_or_default();
                if let Some(f) = ti["inner"].get("function") {
                    let provided = if f["has_body"] == true { " { .. }" } else { "" };
                    out.insert(format!(
                        "{}{provided}",
                        self.function(f, &format!("{here}::{name}"))
                    ));
                } else {
                    out.insert(format!("{here}::{name}: {}", compact(&ti["inner"])));
                }
            }
            for i in t["implementations"].as_array().into_iter().flatten() {
                let imp = &self.item(&i.to_string())["inner"]["impl"];
                let g = self.generics(&imp["generics"]);
                out.insert(format!("impl{} {here} for {}{}", g.0, self.ty(&imp["for"]), g.1));
            }
        } else {
            out.insert(format!("pub {here}: {}", compact(inner)));
        }
    }

    /// Inherent methods and implemented traits of a type.
    fn impls(&self, impls: &Value, here: &str, out: &mut BTreeSet<String>) {
        for i in impls.as_array().into_iter().flatten() {
            let imp = &self.item(&i.to_string())["inner"]["impl"];
            if !imp["blanket_impl"].is_null() {
                continue;
            }
            let g = self.generics(&imp["generics"]);
            if imp["trait"].is_null() {
                for m in imp["items"].as_array().into_iter().flatten() {
                    let method = self.item(&m.to_string());
                    if method["visibility"] != "public" {
                        continue;
                    }
                    let name = method["name"].as_str().unwrap_or_default();
                    let attrs = self.attrs(method);
                    if let Some(f) = method["inner"].get("function") {
                        out.insert(format!("{attrs}{}", self.function(f, &format!("{here}::{name}"))));
                    } else if let Some(c) = method["inner"].get("assoc_const") {
                        out.insert(format!("pub const {here}::{name}: {}", self.ty(&c["type"])));
                    }
                }
            } else {
                let neg = if imp["is_negative"] == true { "!" } else { "" };
                out.insert(format!(
                    "impl{} {neg}{} for {}{}",
                    g.0,
                    self.path(&imp["trait"]),
                    self.ty(&imp["for"]),
                    g.1
                ));
            }
        }
    }

    fn function(&self, f: &Value, here: &str) -> String {
        let h = &f["header"];
        let mut s = String::from("pub ");
        if h["is_const"] == true {
            s.push_str("const ");
        }
        if h["is_async"] == true {
            s.push_str("async ");
        }
        if h["is_unsafe"] == true {
            s.push_str("unsafe ");
        }
        let g = self.generics(&f["generics"]);
        let inputs: Vec<String> = f["sig"]["inputs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let name = p[0].as_str().unwrap_or("_");
                let ty = self.ty(&p[1]);
                match (name, ty.as_str()) {
                    ("self", "Self") => "self".to_string(),
                    ("self", "&Self") => "&self".to_string(),
                    ("self", "&mut Self") => "&mut self".to_string(),
                    _ => format!("{name}: {ty}"),
                }
            })
            .collect();
        let output = &f["sig"]["output"];
        let ret = if output.is_null() {
            String::new()
        } else {
            format!(" -> {}", self.ty(output))
        };
        let _ = write!(s, "fn {here}{}({}){ret}{}", g.0, inputs.join(", "), g.1);
        s
    }

    /// `<params>` and ` where ...`; `impl Trait` parameters show in the arguments instead.
    fn generics(&self, g: &Value) -> (String, String) {
        let mut params = Vec::new();
        for p in g["params"].as_array().into_iter().flatten() {
            let name = p["name"].as_str().unwrap_or_default();
            let kind = &p["kind"];
            if let Some(t) = kind.get("type") {
                if t["is_synthetic"] == true {
                    continue;
                }
                let bounds = self.bounds(&t["bounds"]);
                let mut s = name.to_string();
                if !bounds.is_empty() {
                    let _ = write!(s, ": {bounds}");
                }
                if !t["default"].is_null() {
                    let _ = write!(s, " = {}", self.ty(&t["default"]));
                }
                params.push(s);
            } else if let Some(c) = kind.get("const") {
                params.push(format!("const {name}: {}", self.ty(&c["type"])));
            } else {
                params.push(name.to_string());
            }
        }
        let mut preds = Vec::new();
        for w in g["where_predicates"].as_array().into_iter().flatten() {
            if let Some(b) = w.get("bound_predicate") {
                preds.push(format!("{}: {}", self.ty(&b["type"]), self.bounds(&b["bounds"])));
            } else {
                preds.push(compact(w));
            }
        }
        let params = if params.is_empty() {
            String::new()
        } else {
            format!("<{}>", params.join(", "))
        };
        let preds = if preds.is_empty() {
            String::new()
        } else {
            format!(" where {}", preds.join(", "))
        };
        (params, preds)
    }

    fn bounds(&self, bounds: &Value) -> String {
        let parts: Vec<String> = bounds
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                if let Some(t) = b.get("trait_bound") {
                    let m = if t["modifier"] == "maybe" { "?" } else { "" };
                    format!("{m}{}", self.path(&t["trait"]))
                } else if let Some(l) = b.get("outlives") {
                    l.as_str().unwrap_or_default().to_string()
                } else {
                    compact(b)
                }
            })
            .collect();
        parts.join(" + ")
    }

    /// A path with its generic arguments, by its canonical name where rustdoc knows it.
    fn path(&self, p: &Value) -> String {
        let written = p["path"].as_str().unwrap_or_default();
        let name = p["id"].as_u64().map_or_else(
            || written.to_string(),
            |id| self.path_of(&id.to_string(), written),
        );
        format!("{name}{}", self.args(&p["args"]))
    }

    fn path_of(&self, id: &str, fallback: &str) -> String {
        if let Some(p) = self.public.get(id) {
            return p.clone();
        }
        self.doc["paths"][id]["path"]
            .as_array()
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("::")
            })
            .unwrap_or_else(|| fallback.to_string())
    }

    fn args(&self, a: &Value) -> String {
        if let Some(ab) = a.get("angle_bracketed") {
            let mut parts: Vec<String> = ab["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| {
                    if let Some(t) = x.get("type") {
                        self.ty(t)
                    } else if let Some(l) = x.get("lifetime") {
                        l.as_str().unwrap_or_default().to_string()
                    } else {
                        compact(x)
                    }
                })
                .collect();
            for c in ab["constraints"].as_array().into_iter().flatten() {
                let name = c["name"].as_str().unwrap_or_default();
                if let Some(t) = c["binding"].get("equality").and_then(|e| e.get("type")) {
                    parts.push(format!("{name} = {}", self.ty(t)));
                } else if let Some(b) = c["binding"].get("constraint") {
                    parts.push(format!("{name}: {}", self.bounds(b)));
                } else {
                    parts.push(compact(c));
                }
            }
            if parts.is_empty() {
                String::new()
            } else {
                format!("<{}>", parts.join(", "))
            }
        } else if let Some(p) = a.get("parenthesized") {
            let inputs: Vec<String> = p["inputs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| self.ty(t))
                .collect();
            let output = if p["output"].is_null() {
                String::new()
            } else {
                format!(" -> {}", self.ty(&p["output"]))
            };
            format!("({}){output}", inputs.join(", "))
        } else {
            String::new()
        }
    }

    fn ty(&self, t: &Value) -> String {
        if let Some(p) = t.get("resolved_path") {
            self.path(p)
        } else if let Some(g) = t.get("generic").and_then(Value::as_str) {
            g.to_string()
        } else if let Some(p) = t.get("primitive").and_then(Value::as_str) {
            p.to_string()
        } else if let Some(r) = t.get("borrowed_ref") {
            let lt = r["lifetime"]
                .as_str()
                .map(|l| format!("{l} "))
                .unwrap_or_default();
            let m = if r["is_mutable"] == true { "mut " } else { "" };
            format!("&{lt}{m}{}", self.ty(&r["type"]))
        } else if let Some(items) = t.get("tuple").and_then(Value::as_array) {
            let parts: Vec<String> = items.iter().map(|x| self.ty(x)).collect();
            format!("({})", parts.join(", "))
        } else if let Some(s) = t.get("slice") {
            format!("[{}]", self.ty(s))
        } else if let Some(a) = t.get("array") {
            format!("[{}; {}]", self.ty(&a["type"]), a["len"].as_str().unwrap_or("_"))
        } else if let Some(b) = t.get("impl_trait") {
            format!("impl {}", self.bounds(b))
        } else if let Some(d) = t.get("dyn_trait") {
            let mut parts: Vec<String> = d["traits"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| self.path(&x["trait"]))
                .collect();
            if let Some(l) = d["lifetime"].as_str() {
                parts.push(l.to_string());
            }
            format!("dyn {}", parts.join(" + "))
        } else if let Some(q) = t.get("qualified_path") {
            let name = q["name"].as_str().unwrap_or_default();
            let trait_ = if q["trait"].is_null() {
                String::new()
            } else {
                format!(" as {}", self.path(&q["trait"]))
            };
            format!(
                "<{}{trait_}>::{name}{}",
                self.ty(&q["self_type"]),
                self.args(&q["args"])
            )
        } else if let Some(p) = t.get("raw_pointer") {
            let m = if p["is_mutable"] == true { "mut" } else { "const" };
            format!("*{m} {}", self.ty(&p["type"]))
        } else if let Some(f) = t.get("function_pointer") {
            let inputs: Vec<String> = f["sig"]["inputs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| self.ty(&p[1]))
                .collect();
            let out = if f["sig"]["output"].is_null() {
                String::new()
            } else {
                format!(" -> {}", self.ty(&f["sig"]["output"]))
            };
            format!("fn({}){out}", inputs.join(", "))
        } else if t.get("infer").is_some() || t == "infer" {
            "_".into()
        } else {
            compact(t)
        }
    }
}

/// JSON without ids, for shapes the renderer does not know (stable across rebuilds).
fn compact(v: &Value) -> String {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| k.as_str() != "id")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    strip(v).to_string()
}
