//! The tools served now: the fixed ones (built in, command tools: checked
//! once, at start) and each upstream server's (they change while the broker
//! runs: a server restarts, or says its list changed). Readers take the
//! current [`Registry`] whole; a change builds a new one and swaps it in,
//! so a call never sees half a list.
//!
//! When two sources offer one name, the earlier wins: fixed tools first,
//! then the groups in the order they were declared. A tool that loses, or
//! whose input schema is not valid JSON Schema, is left out and said why
//! ([`Refused`]); the others are served.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use tokio::sync::watch;

use super::{Registry, RegistryError, Tool};

/// A tool of a group that is not served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The name it would be served under.
    pub tool: String,
    /// Why it is not.
    pub reason: String,
}

/// The fixed tools and every group's, as one swappable [`Registry`].
pub struct ToolCatalog {
    fixed: Vec<Arc<dyn Tool>>,
    /// Group names in order of precedence.
    order: Vec<String>,
    groups: Mutex<Groups>,
    current: RwLock<Arc<Registry>>,
    /// Counts changes of the served list.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Groups {
    tools: BTreeMap<String, Vec<Arc<dyn Tool>>>,
    refused: BTreeMap<String, Vec<Refused>>,
}

impl std::fmt::Debug for ToolCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolCatalog")
            .field("current", &self.current())
            .field("groups", &self.order)
            .finish()
    }
}

impl ToolCatalog {
    /// The fixed tools (refused whole when two share a name or a schema is
    /// invalid: they come from the code or the config file), and the
    /// groups that may be set later, in order of precedence.
    pub fn new(fixed: Vec<Arc<dyn Tool>>, groups: Vec<String>) -> Result<Self, RegistryError> {
        let registry = Registry::new(fixed.clone())?;
        Ok(Self {
            fixed,
            order: groups,
            groups: Mutex::new(Groups::default()),
            current: RwLock::new(Arc::new(registry)),
            changed: watch::Sender::new(0),
        })
    }

    /// The tools served now.
    pub fn current(&self) -> Arc<Registry> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Serve `tools` as `group`'s (replacing what it had); returns the ones
    /// of this group left out, and why.
    pub fn set_group(&self, group: &str, tools: Vec<Arc<dyn Tool>>) -> Vec<Refused> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.tools.insert(group.to_owned(), tools);
        let (registry, refused) = self.build(&groups.tools);
        // Said once each: a group set later may push out another group's
        // tool (the earlier-declared one wins whoever answered first).
        for (owner, now) in &refused {
            let before = groups.refused.get(owner);
            for r in now.iter().filter(|r| before.is_none_or(|b| !b.contains(r))) {
                tracing::warn!(upstream = %owner, tool = %r.tool, reason = %r.reason,
                               "an upstream tool is not served");
            }
        }
        groups.refused = refused;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(registry);
        self.changed.send_modify(|n| *n += 1);
        groups.refused.get(group).cloned().unwrap_or_default()
    }

    /// The groups (upstreams) that may be set, in order of precedence.
    pub fn groups(&self) -> &[String] {
        &self.order
    }

    /// The tools of `group` left out now, and why.
    pub fn refused(&self, group: &str) -> Vec<Refused> {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.refused.get(group).cloned().unwrap_or_default()
    }

    /// The names served now of `group`'s tools (those of its last list
    /// that no earlier source took, with a valid schema), in its order.
    pub fn served(&self, group: &str) -> Vec<String> {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let refused = groups.refused.get(group);
        groups
            .tools
            .get(group)
            .into_iter()
            .flatten()
            .map(|t| t.definition().name.clone())
            .filter(|name| refused.is_none_or(|r| !r.iter().any(|r| &r.tool == name)))
            .collect()
    }

    /// Changes each time the served list changes.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn build(
        &self,
        groups: &BTreeMap<String, Vec<Arc<dyn Tool>>>,
    ) -> (Registry, BTreeMap<String, Vec<Refused>>) {
        let mut registry = Registry {
            tools: BTreeMap::new(),
        };
        let mut owner: BTreeMap<String, String> = BTreeMap::new();
        for tool in &self.fixed {
            // Checked in `new`: none fails.
            if registry.add(tool.clone()).is_ok() {
                owner.insert(
                    tool.definition().name.clone(),
                    "a built-in or command tool".to_owned(),
                );
            }
        }
        let mut refused: BTreeMap<String, Vec<Refused>> = BTreeMap::new();
        for group in &self.order {
            let Some(tools) = groups.get(group) else {
                continue;
            };
            for tool in tools {
                let name = tool.definition().name.clone();
                let reason = match registry.add(tool.clone()) {
                    Ok(()) => {
                        owner.insert(name, format!("upstream '{group}'"));
                        continue;
                    }
                    Err(RegistryError::Duplicate(_)) => format!(
                        "{} already serves a tool named '{name}' (give upstream '{group}' a prefix)",
                        owner
                            .get(&name)
                            .map(String::as_str)
                            .unwrap_or("another source")
                    ),
                    Err(RegistryError::BadSchema { reason, .. }) => {
                        format!("its inputSchema is not valid JSON Schema: {reason}")
                    }
                };
                refused
                    .entry(group.clone())
                    .or_default()
                    .push(Refused { tool: name, reason });
            }
        }
        (registry, refused)
    }
}
