//! Broadcasts and named groups through the service, on either backend
//! (`TROUPE_TEST_BACKEND`): who a message to many reaches (the trust matrix
//! of sender and recipient, workspaces never crossed, each recipient once),
//! ended recipients reported, the fan-out cap and the message rate refusing
//! before anything is stored, a request id replaying the whole answer, and
//! a sandboxed member's view of its groups; who may add members, and whose
//! a group's name is.

mod limits;
mod membership;
mod trust;

use std::collections::BTreeMap;

use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{Client, TestServer, child, create_child};

/// Sessions of the matrix: the senders are roots of `alpha`; every other
/// session is a root too, but `child`, a sandboxed child of `direct`.
pub struct World {
    pub server: TestServer,
    pub ids: BTreeMap<&'static str, String>,
    clients: BTreeMap<&'static str, Client>,
}

impl World {
    pub async fn start(adjust: impl FnOnce(&mut troupe_session_svc::Config)) -> World {
        let server = TestServer::start_with(adjust).await;
        let mut ids = BTreeMap::new();
        let mut clients = BTreeMap::new();
        for (name, ws, trust) in [
            ("direct", "alpha", TrustLevel::Direct),
            ("sandboxed", "alpha", TrustLevel::Sandboxed),
            ("direct2", "alpha", TrustLevel::Direct),
            ("sandboxed2", "alpha", TrustLevel::Sandboxed),
            ("beta_direct", "beta", TrustLevel::Direct),
            ("beta_sandboxed", "beta", TrustLevel::Sandboxed),
        ] {
            let (session, client, _) = server.root(ws, trust).await;
            ids.insert(name, session.session_id);
            clients.insert(name, client);
        }
        let mut direct = clients["direct"].clone();
        let kid = create_child(
            &mut direct,
            pb::CreateSessionRequest {
                trust_level: TrustLevel::Sandboxed as i32,
                ..child("child")
            },
        )
        .await;
        clients.insert("child", server.act_as(&kid.session_id).await);
        ids.insert("child", kid.session_id);
        World {
            server,
            ids,
            clients,
        }
    }

    pub fn client(&self, name: &str) -> Client {
        self.clients[name].clone()
    }

    pub fn name_of(&self, id: &str) -> &'static str {
        self.ids
            .iter()
            .find(|(_, v)| *v == id)
            .map(|(k, _)| *k)
            .unwrap_or_else(|| panic!("unknown session {id}"))
    }

    /// A request adding the sessions `names` to `group`.
    pub fn members(&self, group: &str, names: &[&str]) -> pb::AddGroupMembersRequest {
        pb::AddGroupMembersRequest {
            group: group.to_owned(),
            session_ids: names.iter().map(|n| self.ids[n].clone()).collect(),
        }
    }

    /// Every session's inbox count.
    pub async fn inboxes(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for (name, id) in &self.ids {
            out.insert(*name, self.server.get(id).await.inbox_count);
        }
        out
    }

    /// The sessions whose inbox grew since `before`, each by exactly one.
    pub async fn grown_once(&self, before: &BTreeMap<&'static str, u64>) -> Vec<&'static str> {
        let after = self.inboxes().await;
        let mut grown = Vec::new();
        for (name, n) in after {
            match n - before[name] {
                0 => {}
                1 => grown.push(name),
                more => panic!("{name} received {more} messages"),
            }
        }
        grown
    }

    /// The names of the recipients an answer lists with `outcome`.
    pub fn names(&self, recipients: &[pb::Recipient], outcome: pb::RecipientOutcome) -> Vec<&str> {
        let mut names: Vec<&str> = recipients
            .iter()
            .filter(|r| r.outcome == outcome as i32)
            .map(|r| self.name_of(&r.session_id))
            .collect();
        names.sort_unstable();
        names
    }
}

pub fn broadcast(text: &str, scope: pb::BroadcastScope) -> pb::BroadcastRequest {
    pb::BroadcastRequest {
        message: text.to_owned(),
        scope: scope as i32,
        ..Default::default()
    }
}

/// The groups `client`'s session lists.
pub async fn groups_of(client: &mut Client) -> Vec<pb::Group> {
    client
        .list_groups(pb::ListGroupsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .groups
}

pub fn new_group(name: &str) -> pb::CreateGroupRequest {
    pb::CreateGroupRequest {
        name: name.to_owned(),
    }
}

pub fn post(group: &str, text: &str) -> pb::PostToGroupRequest {
    pb::PostToGroupRequest {
        group: group.to_owned(),
        message: text.to_owned(),
        request_id: String::new(),
    }
}

pub const DELIVERED: pb::RecipientOutcome = pb::RecipientOutcome::Delivered;
pub const ENDED: pb::RecipientOutcome = pb::RecipientOutcome::Ended;
