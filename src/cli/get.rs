//! `kcpshard get [NAME] [-o yaml|json|wide|name] [-w]`: what `kubectl get kcpshards` prints.
//!
//! The table comes from the server (`as=Table`), as it does for kubectl, so the columns are the
//! CRD's printer columns and there is one definition of them. A server that answers without a
//! Table gets kubectl's fallback: NAME and AGE.
use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use serde_json::{Value, json};

use super::connect::{Cluster, Conn, GROUP, PLURAL, QUALIFIED, VERSION};
use super::table::{self, Columns};
use super::watch::Watch;

const ACCEPT_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
const ACCEPT_JSON: &str = "application/json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Yaml,
    Json,
    Wide,
    Name,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show only this KcpShard.
    name: Option<String>,
    /// Output format: yaml, json, wide (every printer column) or name.
    #[arg(short, long, value_enum)]
    output: Option<Output>,
    /// After listing, keep printing changes as they happen.
    #[arg(short, long)]
    watch: bool,
    /// Only objects whose labels match this selector (e.g. `env=dev`).
    #[arg(short = 'l', long)]
    selector: Option<String>,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let cluster = args.conn.connect().await?;
    let accept = match args.output {
        None | Some(Output::Wide) => ACCEPT_TABLE,
        _ => ACCEPT_JSON,
    };
    let first = fetch(&cluster, &args.path(args.name.as_deref()), accept).await?;
    let mut printer = Printer::new(args.output);
    printer.print_first(&first, args.name.is_some() || args.watch)?;
    if !args.watch {
        return Ok(());
    }
    let resource_version = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut watch = Watch::new(args.watch_path(), accept, resource_version);
    loop {
        let (event_type, object) = watch.next(&cluster).await?;
        printer.print_event(&cluster, &event_type, &object).await?;
    }
}

impl Args {
    fn path(&self, name: Option<&str>) -> String {
        let mut path = format!("/apis/{GROUP}/{VERSION}/{PLURAL}");
        if let Some(name) = name {
            path.push('/');
            path.push_str(&encode(name));
        }
        if let Some(selector) = &self.selector {
            path.push_str(&format!("?labelSelector={}", encode(selector)));
        }
        path
    }

    fn watch_path(&self) -> String {
        let mut path = self.path(None);
        if let Some(name) = &self.name {
            let separator = if path.contains('?') { '&' } else { '?' };
            let selector = encode(&format!("metadata.name={name}"));
            path.push_str(&format!("{separator}fieldSelector={selector}"));
        }
        path
    }
}

fn encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

async fn fetch(cluster: &Cluster, path: &str, accept: &str) -> anyhow::Result<Value> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())?;
    let text = cluster
        .client
        .request_text(request)
        .await
        .map_err(|e| cluster.explain(e))?;
    serde_json::from_str(&text).with_context(|| format!("the server sent invalid JSON for {path}"))
}

/// Prints a first answer and then watch events in one of kubectl's formats.
struct Printer {
    output: Option<Output>,
    columns: Columns,
    /// Index and type of each printed column of the server's Table.
    shown: Vec<(usize, String)>,
    /// The last row printed per object, printed again when a watch says it was deleted.
    last_rows: BTreeMap<String, Vec<String>>,
}

impl Printer {
    fn new(output: Option<Output>) -> Self {
        Printer {
            output,
            columns: Columns::default(),
            shown: Vec::new(),
            last_rows: BTreeMap::new(),
        }
    }

    fn is_table(&self) -> bool {
        matches!(self.output, None | Some(Output::Wide))
    }

    fn print_first(&mut self, value: &Value, single: bool) -> anyhow::Result<()> {
        if !self.is_table() {
            let objects = match value["items"].as_array() {
                Some(items) if matches!(self.output, Some(Output::Name)) => items.clone(),
                // kubectl prints a list as a v1 List of the items.
                Some(items) => vec![json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": items.iter().map(with_type_meta).collect::<Vec<_>>(),
                    "metadata": {"resourceVersion": ""},
                })],
                None => vec![value.clone()],
            };
            for object in objects {
                self.print_object(&object)?;
            }
            return Ok(());
        }
        let header = self.header(value);
        let rows = self.rows(value);
        if rows.is_empty() {
            eprintln!("No resources found");
            if !single {
                return Ok(());
            }
        }
        let mut all = vec![header];
        all.extend(rows);
        write(&self.columns.render(&all))
    }

    async fn print_event(&mut self, cluster: &Cluster, event_type: &str, object: &Value) -> anyhow::Result<()> {
        if !self.is_table() {
            if matches!(self.output, Some(Output::Yaml)) {
                write("---\n")?;
            }
            return self.print_object(object);
        }
        let rows = if object["kind"] == "Table" {
            self.rows(object)
        } else if event_type == "DELETED" {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            self.last_rows.get(name).cloned().into_iter().collect()
        } else {
            // A server that watches without Tables: ask for this object's row.
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let path = format!("/apis/{GROUP}/{VERSION}/{PLURAL}/{}", encode(name));
            match fetch(cluster, &path, ACCEPT_TABLE).await {
                Ok(table) => self.rows(&table),
                Err(_) => vec![fallback_row(object)],
            }
        };
        write(&self.columns.render(&rows))
    }

    fn print_object(&self, object: &Value) -> anyhow::Result<()> {
        // As kubectl without --show-managed-fields: managedFields are the server's bookkeeping.
        let hide = |item: &mut Value| {
            if let Some(metadata) = item["metadata"].as_object_mut() {
                metadata.remove("managedFields");
            }
        };
        let mut object = object.clone();
        object["items"].as_array_mut().into_iter().flatten().for_each(hide);
        hide(&mut object);
        let object = &object;
        match self.output {
            Some(Output::Yaml) => write(&serde_yaml::to_string(object)?),
            Some(Output::Json) => write(&(to_json_4(object)? + "\n")),
            _ => {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                write(&format!("{QUALIFIED}/{name}\n"))
            }
        }
    }

    /// Column names (upper-cased, as kubectl prints them); remembers which columns to print.
    fn header(&mut self, table: &Value) -> Vec<String> {
        if table["kind"] != "Table" {
            self.shown.clear();
            return vec!["NAME".into(), "AGE".into()];
        }
        let wide = self.output == Some(Output::Wide);
        let definitions = table["columnDefinitions"].as_array().cloned().unwrap_or_default();
        let mut names = Vec::new();
        self.shown.clear();
        for (i, column) in definitions.iter().enumerate() {
            if !wide && column["priority"].as_i64().unwrap_or(0) != 0 {
                continue;
            }
            let kind = column["format"]
                .as_str()
                .filter(|f| !f.is_empty())
                .or(column["type"].as_str())
                .unwrap_or("string");
            self.shown.push((i, kind.to_string()));
            names.push(column["name"].as_str().unwrap_or("").to_uppercase());
        }
        names
    }

    fn rows(&mut self, value: &Value) -> Vec<Vec<String>> {
        let rows: Vec<Vec<String>> = if value["kind"] == "Table" {
            let rows = value["rows"].as_array().cloned().unwrap_or_default();
            rows.iter().map(|row| self.cells(row)).collect()
        } else if let Some(items) = value["items"].as_array() {
            items.iter().map(fallback_row).collect()
        } else {
            vec![fallback_row(value)]
        };
        for row in &rows {
            if let Some(name) = row.first() {
                self.last_rows.insert(name.clone(), row.clone());
            }
        }
        rows
    }

    fn cells(&self, row: &Value) -> Vec<String> {
        let cells = row["cells"].as_array().cloned().unwrap_or_default();
        self.shown
            .iter()
            .map(|(i, kind)| match cells.get(*i).unwrap_or(&Value::Null) {
                Value::Null => String::new(),
                // The real server humanises dates itself; accept raw timestamps too.
                Value::String(s) if kind == "date" && chrono::DateTime::parse_from_rfc3339(s).is_ok() => {
                    table::age(Some(s))
                }
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect()
    }
}

fn fallback_row(object: &Value) -> Vec<String> {
    vec![
        object["metadata"]["name"].as_str().unwrap_or("").to_string(),
        table::age(object["metadata"]["creationTimestamp"].as_str()),
    ]
}

/// List items may come without apiVersion and kind; kubectl fills them in.
fn with_type_meta(item: &Value) -> Value {
    let mut item = item.clone();
    if let Some(map) = item.as_object_mut() {
        map.entry("apiVersion")
            .or_insert_with(|| json!(format!("{GROUP}/{VERSION}")));
        map.entry("kind").or_insert_with(|| json!("KcpShard"));
    }
    item
}

/// kubectl indents JSON by four spaces.
fn to_json_4(value: &Value) -> anyhow::Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(value, &mut serializer)?;
    Ok(String::from_utf8(out)?)
}

fn write(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
