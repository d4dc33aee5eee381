//! kubectl's plain-text conventions: columns padded with three spaces, ages humanised the way
//! `k8s.io/apimachinery/pkg/util/duration.HumanDuration` does it.
use chrono::{DateTime, Utc};

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
    match timestamp.and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
        Some(t) => human_duration((Utc::now() - t.with_timezone(&Utc)).num_seconds()),
        None => "<unknown>".to_string(),
    }
}

/// `duration.HumanDuration` from k8s.io/apimachinery, over whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Go's `text/tabwriter` (minwidth 0, padding `padding`, spaces), which kubectl's `describe` and
/// `events` print through: cells end at `\t`; a column block is a run of consecutive lines that
/// have a cell in that column, and is as wide as its widest cell plus the padding.
pub fn tabwrite(text: &str, padding: usize) -> String {
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let mut widths: Vec<Vec<usize>> = vec![Vec::new(); lines.len()];
    column_blocks(
        &lines,
        0,
        lines.len(),
        &mut Vec::new(),
        &mut widths,
        padding,
    );
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
    fn human_duration_matches_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (8 * 24 * 3600, "8d"),
            (2 * 365 * 24 * 3600, "2y"),
            (2 * 365 * 24 * 3600 + 24 * 3600, "2y1d"),
            (9 * 365 * 24 * 3600, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }

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
        let first = columns.render(&[
            vec!["NAME".into(), "AGE".into()],
            vec!["dev".into(), "5s".into()],
        ]);
        assert_eq!(first, "NAME   AGE\ndev    5s\n");
        let later = columns.render(&[vec!["a".into(), "1s".into()]]);
        assert_eq!(later, "a      1s\n");
    }
}
