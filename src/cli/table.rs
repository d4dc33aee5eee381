//! kubectl's plain-text conventions: columns padded with three spaces, ages humanised the way
//! `k8s.io/apimachinery/pkg/util/duration.HumanDuration` does it.
use chrono::Utc;

/// Column widths that only grow, so that rows printed later (by a watch) line up with the header.
#[derive(Debug, Default)]
pub struct Columns {
    widths: Vec<usize>,
}

impl Columns {
    /// Renders rows (the first is usually the header), widening columns to fit.
    pub fn render(&mut self, rows: &[Vec<String>]) -> String {
        for row in rows {
            for (i, cell) in row.iter().enumerate() {
                let width = cell.chars().count();
                match self.widths.get_mut(i) {
                    Some(w) => *w = (*w).max(width),
                    None => self.widths.push(width),
                }
            }
        }
        let mut out = String::new();
        for row in rows {
            let last = row.len().saturating_sub(1);
            for (i, cell) in row.iter().enumerate() {
                out.push_str(cell);
                if i < last {
                    let pad = self.widths[i] - cell.chars().count() + 3;
                    out.push_str(&" ".repeat(pad));
                }
            }
            out.push('\n');
        }
        out
    }
}

/// Age of an RFC 3339 timestamp, as kubectl prints it (`<unknown>` when absent or unparsable).
pub fn age(timestamp: Option<&str>) -> String {
    match timestamp {
        Some(t) => crate::apiserver::table::age(t, Utc::now()),
        None => "<unknown>".to_string(),
    }
}

/// Go's `text/tabwriter` (minwidth 0, padding `padding`, spaces), which kubectl's `describe` and
/// `events` print through: cells end at `\t`; a column block is a run of consecutive lines that
/// have a cell in that column, and is as wide as its widest cell plus the padding.
pub fn tabwrite(text: &str, padding: usize) -> String {
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let mut widths: Vec<Vec<usize>> = vec![Vec::new(); lines.len()];
    column_blocks(&lines, 0, lines.len(), &mut Vec::new(), &mut widths, padding);
    let mut out = String::new();
    for (line, widths) in lines.iter().zip(&widths) {
        for (i, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < line.len() {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count());
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    }
    out
}

fn column_blocks(
    lines: &[Vec<&str>],
    mut line0: usize,
    line1: usize,
    stack: &mut Vec<usize>,
    widths: &mut [Vec<usize>],
    padding: usize,
) {
    let column = stack.len();
    let mut this = line0;
    while this < line1 {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        assign(stack, widths, line0, this);
        line0 = this;
        let mut width = 0;
        while this < line1 && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count() + padding);
            this += 1;
        }
        stack.push(width);
        column_blocks(lines, line0, this, stack, widths, padding);
        stack.pop();
        line0 = this;
    }
    assign(stack, widths, line0, line1);
}

fn assign(stack: &[usize], widths: &mut [Vec<usize>], from: usize, to: usize) {
    for line in widths.iter_mut().take(to).skip(from) {
        if line.is_empty() {
            *line = stack.to_vec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tabwrite_aligns_blocks_of_consecutive_lines() {
        let text = "Name:\tdev\nSpec:\n  Version:\tv1\n  Kcp:\n    Binary:\tbin/kcp\n";
        assert_eq!(
            tabwrite(text, 2),
            "Name:  dev\nSpec:\n  Version:  v1\n  Kcp:\n    Binary:  bin/kcp\n"
        );
        let events = "Type\tReason\tMessage\nNormal\tStarted\tslot blue\n";
        assert_eq!(
            tabwrite(events, 2),
            "Type    Reason   Message\nNormal  Started  slot blue\n"
        );
    }

    #[test]
    fn columns_are_padded_by_three_spaces_and_keep_their_width() {
        let mut columns = Columns::default();
        let first = columns.render(&[vec!["NAME".into(), "AGE".into()], vec!["dev".into(), "5s".into()]]);
        assert_eq!(first, "NAME   AGE\ndev    5s\n");
        let later = columns.render(&[vec!["a".into(), "1s".into()]]);
        assert_eq!(later, "a      1s\n");
    }
}
