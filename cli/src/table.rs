//! Plain text tables: columns padded to their widest cell, the last one left
//! ragged, each cell one terminal-safe line ([`crate::safe::line`]).

/// Returns the table as lines, header first.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| crate::safe::line(cell).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_control_characters_are_escaped() {
        let rows = vec![
            vec![
                "sess_1".to_owned(),
                "running".to_owned(),
                "two\nlines".to_owned(),
            ],
            vec!["s2".to_owned(), "-".to_owned(), String::new()],
        ];
        assert_eq!(
            render(&["ID", "STATUS", "TITLE"], &rows),
            "ID      STATUS   TITLE\n\
             sess_1  running  two\\nlines\n\
             s2      -\n"
        );
    }
}
