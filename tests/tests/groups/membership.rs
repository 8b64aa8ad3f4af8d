//! Who may join a group, and whose a group's name is: members are added
//! only if the adder may message them, only by a member, and a name is its
//! first creator's in its workspace.

use tonic::Code;
use troupe_tests::reason;

use super::{World, groups_of, new_group, post};

#[tokio::test]
async fn members_are_added_only_if_the_adder_may_message_them() {
    let w = World::start(|_| {}).await;
    let mut sandboxed = w.client("sandboxed");
    sandboxed
        .create_group(new_group("low"))
        .await
        .expect("create");
    for target in ["direct", "beta_sandboxed", "beta_direct"] {
        let refused = sandboxed
            .add_group_members(w.members("low", &["sandboxed2", target]))
            .await
            .expect_err(target);
        assert_eq!(refused.code(), Code::NotFound, "{target}: {refused:?}");
    }
    // None of a refused call's members were added.
    let group = groups_of(&mut sandboxed).await.remove(0);
    assert_eq!(group.member_ids, [w.ids["sandboxed"].clone()]);

    // A non-member may not add, and a name is the first creator's.
    let not_member = w
        .client("direct")
        .add_group_members(w.members("low", &["direct"]))
        .await
        .expect_err("not a member");
    assert_eq!(reason(&not_member), "GROUP_NOT_FOUND");
    let before = w.inboxes().await;
    let not_member = w
        .client("direct")
        .post_to_group(post("low", "let me in"))
        .await
        .expect_err("a non-member posts");
    assert_eq!(reason(&not_member), "GROUP_NOT_FOUND");
    assert!(w.grown_once(&before).await.is_empty());
    let taken = w
        .client("direct")
        .create_group(new_group("low"))
        .await
        .expect_err("taken");
    assert_eq!(
        (taken.code(), reason(&taken).as_str()),
        (Code::AlreadyExists, "GROUP_EXISTS")
    );
    let again = sandboxed
        .create_group(new_group("low"))
        .await
        .expect("the creator's retry answers its group");
    assert_eq!(again.into_inner().group.expect("group").name, "low");
    // Another workspace may use the name.
    w.client("beta_sandboxed")
        .create_group(new_group("low"))
        .await
        .expect("another workspace's own");
    let refused = w
        .client("direct")
        .create_group(new_group("../x"))
        .await
        .expect_err("bad name");
    assert_eq!(refused.code(), Code::InvalidArgument);
}
