//! [`GatedBuilderExt`]: what the facade adds to the adapter's [`GatedBuilder`], which takes open
//! stores and a computed contract and names no backend: open stores ([`GatedBuilderExt::stores`]),
//! the operator's command line ([`GatedBuilderExt::gate_args`]) and the contract a server's
//! committed `toolgate.lock` records ([`GatedBuilderExt::locked_contract`]). In the prelude.

use rmcp::model::Tool;
use toolgate_rmcp::GatedBuilder;
use toolgate_state::RightsFile;

use crate::operator::{GateArgs, OperatorError};
use crate::stores::Stores;

/// The facade's methods of [`GatedBuilder`] (`use toolgate::prelude::*` brings them in).
pub trait GatedBuilderExt: Sized {
    /// Every store of `stores`: the audit chain, the exactly-once store, the kill switch, and
    /// what the store shares between replicas (rights, Cedar entities, rate buckets, pending
    /// confirmations). A later [`GatedBuilder::rights`] or [`GatedBuilder::entities`] replaces
    /// the store's (the reference server refuses a rights or entities file together with a
    /// database: two sources would disagree).
    fn stores(self, stores: Stores) -> Self;

    /// Everything `args` names, as the operator commands see it: the policy file, the stores
    /// ([`GateArgs::open_stores`]: the database of `--store`, else the ledger with the audit key,
    /// mirror and segments of the command line), the principal and the rights file, and
    /// `server_name` for messages that name an operator command. The stores are opened here, so
    /// a database that cannot be used is this call's error.
    fn gate_args(self, args: &GateArgs, server_name: &str) -> Result<Self, OperatorError>;

    /// The live contract of a server that runs without its sources, computed at
    /// [`GatedBuilder::build`] under the policy loaded there: `tools` as compiled (e.g. the
    /// router's `list_all()`), with the entitlements its committed `toolgate.lock` records
    /// (`lockfile`, e.g. `include_str!("../toolgate.lock")`; the server's lock check keeps them
    /// equal to its sources). Published and recorded as [`GatedBuilder::contract`] does; a
    /// lockfile that does not parse or lacks a tool is the build's error
    /// (`GateError::Contract`). Replaces [`GatedBuilder::contract`].
    fn locked_contract(self, tools: Vec<Tool>, lockfile: impl Into<String>) -> Self;
}

impl<H: rmcp::ServerHandler> GatedBuilderExt for GatedBuilder<H> {
    fn stores(self, stores: Stores) -> Self {
        let builder = self
            .audit(stores.audit)
            .effect_store(stores.effects)
            .kill_switch(stores.kill_switch);
        let builder = match stores.rights {
            Some(rights) => builder.rights(rights),
            None => builder,
        };
        let builder = match stores.entities {
            Some(entities) => builder.entities(entities),
            None => builder,
        };
        let builder = match stores.rates {
            Some(rates) => builder.rate_store(rates),
            None => builder,
        };
        match stores.pending {
            Some(pending) => builder.pending_store(pending),
            None => builder,
        }
    }

    fn gate_args(self, args: &GateArgs, server_name: &str) -> Result<Self, OperatorError> {
        let policy = args.load_policy()?;
        let stores = args.open_stores(server_name, &policy, args.audit_config()?)?;
        let builder = self.policy(policy).stores(stores).server_name(server_name);
        let builder = match &args.principal {
            Some(principal) => builder.principal(principal.clone()),
            None => builder,
        };
        let builder = match &args.entities {
            Some(path) => builder.entities(crate::checks::EntitiesFile::new(path)),
            None => builder,
        };
        Ok(match &args.rights {
            Some(path) => builder.rights(RightsFile::new(path)),
            None => builder,
        })
    }

    fn locked_contract(self, tools: Vec<Tool>, lockfile: impl Into<String>) -> Self {
        let lockfile = lockfile.into();
        self.contract_at_build(move |policy| {
            crate::live::live_lockfile(&tools, policy, &lockfile).map_err(Into::into)
        })
    }
}
