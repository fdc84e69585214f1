//! The library's layers (README, Layout): each folder of `src` is a layer,
//! and a module uses only modules of its own layer or of layers below it,
//! with no cycle between modules. Read from the source, so a new `use` that
//! breaks the order fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. `config` and `error` are the foundation, below every layer.
const LAYERS: &[&str] = &["", "term", "connect", "store", "ops", "leader", "schedule"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module file as its path under `src` without `.rs` (`store/postgres`),
/// except the crate root and the layers' own files that only declare modules.
fn modules() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let name = path.strip_prefix(src()).unwrap().with_extension("");
                let name = name.to_string_lossy().replace('\\', "/");
                let text = std::fs::read_to_string(&path).unwrap();
                found.insert(name, text);
            }
        }
    }
    found.remove("lib");
    // The metrics module without the feature stands for the same module.
    found.remove("ops/metrics_off");
    found
}

fn layer_of(module: &str) -> usize {
    let top = if module.contains('/') || LAYERS.contains(&module) {
        module.split('/').next().unwrap()
    } else {
        ""
    };
    LAYERS
        .iter()
        .position(|l| *l == top)
        .unwrap_or_else(|| panic!("{module} is in no layer: {LAYERS:?}"))
}

/// The crate root's re-exports: `Family` → `term/family`.
fn root_names(modules: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut names = BTreeMap::new();
    let mut statement = String::new();
    for line in lib.lines() {
        if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            if !line.trim_end().ends_with(';') {
                continue;
            }
            let body = statement
                .trim_start_matches("pub use ")
                .trim_end_matches(';')
                .to_string();
            statement.clear();
            let (path, items) = match body.split_once("::{") {
                Some((p, i)) => (p.to_string(), i.trim_end_matches('}').to_string()),
                None => match body.rsplit_once("::") {
                    Some((p, i)) => (p.to_string(), i.to_string()),
                    None => (body.clone(), body.clone()),
                },
            };
            let module = resolve(&path.split("::").collect::<Vec<_>>(), modules);
            for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                if let Some(m) = &module {
                    names.insert(item.to_string(), m.clone());
                }
            }
        }
    }
    names
}

/// The longest prefix of `path` that is a module file.
fn resolve(path: &[&str], modules: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("/"))
        .find(|m| modules.contains_key(m))
}

/// The modules `module` uses: `crate::a::b` paths, the crate root's
/// re-exports, and `super::` (outside its tests).
fn uses(
    module: &str,
    text: &str,
    modules: &BTreeMap<String, String>,
    roots: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    let mut used = BTreeSet::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::").or_else(|| rest.find("super::")) {
            let tail: String = rest[at..].chars().take_while(|c| word(*c) || *c == '{').collect();
            let tail = tail.trim_end_matches([':', '{']);
            let parts: Vec<&str> = tail.split("::").collect();
            let path: Vec<&str> = if parts[0] == "super" {
                let mut parent: Vec<&str> = module.split('/').collect();
                parent.pop();
                parent.into_iter().chain(parts[1..].iter().copied()).collect()
            } else {
                parts[1..].to_vec()
            };
            let target = resolve(&path, modules).or_else(|| {
                let first = path.first()?;
                roots.get(*first).cloned().or_else(|| {
                    // `super::{a, b}` of a layer's module: the layer file itself.
                    modules.contains_key(&path.join("/")).then(|| path.join("/"))
                })
            });
            if let Some(t) = target.filter(|t| t != module) {
                used.insert(t);
            }
            rest = &rest[at + 7..];
        }
    }
    used
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let roots = root_names(&modules);
    modules
        .iter()
        .map(|(m, text)| (m.clone(), uses(m, text, &modules, &roots)))
        .collect()
}

#[test]
fn every_module_uses_only_its_own_layer_and_the_layers_below() {
    let graph = graph();
    assert!(graph.len() >= 25, "{:?}", graph.keys());
    let mut wrong = Vec::new();
    for (module, used) in &graph {
        for target in used {
            if layer_of(target) > layer_of(module) {
                wrong.push(format!("{module} uses {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "uses of a higher layer: {wrong:#?}");
}

#[test]
fn no_two_modules_use_each_other_even_through_others() {
    let graph = graph();
    // Depth-first, colouring: a grey module met again closes a cycle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(true) => return None,
            Some(false) => {
                let from = stack.iter().position(|s| s == m).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            None => {}
        }
        state.insert(m.to_string(), false);
        stack.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(m.to_string(), true);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        let cycle = visit(m, &graph, &mut state, &mut Vec::new());
        assert!(cycle.is_none(), "a module cycle: {}", cycle.unwrap().join(" -> "));
    }
}
