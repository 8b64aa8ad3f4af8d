//! The output tail: the last bytes printed, every one of them.

use super::*;

/// A NUL, bytes that are not UTF-8, characters of several bytes: the tail is
/// the last bytes printed, every one of them.
#[tokio::test]
async fn every_byte_printed_reaches_the_output_tail() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), OutputBudget::default()).await;
    running(&store, "sess_bytes").await;
    let chunks: [&[u8]; 4] = [
        b"visible\0hidden",
        b"\xff\xfe\0",
        "\u{e9}t\u{e9}".as_bytes(),
        b"\0end",
    ];
    let mut printed = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        print(&store, "sess_bytes", i as u64 + 2, output(c.to_vec())).await;
        printed.extend_from_slice(c);
    }
    let tail = store
        .process(&"sess_bytes".into())
        .await
        .unwrap()
        .unwrap()
        .output_tail;
    assert_eq!(tail, printed);

    // Past the tail's size, its last bytes, counted as bytes.
    let limited = store
        .record_process(
            &fence(&store).await,
            &"sess_bytes".into(),
            10,
            output(b"\0\0tail".to_vec()),
            8,
        )
        .await
        .unwrap();
    assert!(limited.is_some());
    printed.extend_from_slice(b"\0\0tail");
    let tail = store
        .process(&"sess_bytes".into())
        .await
        .unwrap()
        .unwrap()
        .output_tail;
    assert_eq!(tail, printed[printed.len() - 8..]);
}
