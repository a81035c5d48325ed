//! Command-line flags: `[--quick] [--out DIR] [--only P1,P4]`.

use std::path::PathBuf;

use crate::error::BenchError;

const USAGE: &str = concat!(
    "usage: cargo bench --bench redlock -- [--quick] [--out DIR] [--only P1,P2,...]\n",
    "  --quick      a few seconds per scenario family, to prove the bench still runs (CI)\n",
    "  --out DIR    where results.json, results.md and latency.svg go\n",
    "               (default: bench-results for the full run, target/bench-quick for --quick)\n",
    "  --only LIST  run only these scenario families (P1..P6), comma-separated",
);

/// The scenario families, in the order they run.
pub const FAMILIES: [&str; 6] = ["P1", "P2", "P3", "P4", "P5", "P6"];

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Args {
    pub quick: bool,
    pub out: PathBuf,
    pub only: Vec<String>,
}

impl Args {
    /// Parses the flags after `--`. `cargo bench` adds `--bench` itself: it is accepted and
    /// ignored. `Ok(None)` means `--help` was asked for (the usage has been printed).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, BenchError> {
        let mut quick = false;
        let mut out = None;
        let mut only = FAMILIES.iter().map(|f| f.to_string()).collect();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--bench" => {}
                "--out" => out = Some(PathBuf::from(value(&mut args, "--out")?)),
                "--only" => only = families(&value(&mut args, "--only")?)?,
                "-h" | "--help" => {
                    println!("{USAGE}");
                    return Ok(None);
                }
                other => {
                    return Err(BenchError::new(
                        "reading the command line",
                        format!("unknown argument {other:?}"),
                        "pass only the flags listed by --help, after `--`",
                    ))
                }
            }
        }
        let out = out.unwrap_or_else(|| {
            if quick {
                PathBuf::from("target/bench-quick")
            } else {
                PathBuf::from("bench-results")
            }
        });
        Ok(Some(Args { quick, out, only }))
    }

    /// Whether the family `P1`..`P6` is to run.
    pub fn runs(&self, family: &str) -> bool {
        self.only.iter().any(|f| f == family)
    }
}

fn value(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, BenchError> {
    args.next().filter(|v| !v.starts_with("--")).ok_or_else(|| {
        let advice = match flag {
            "--out" => "write it as `--out DIR`",
            _ => "write it as `--only P1,P4`",
        };
        BenchError::new(
            "reading the command line",
            format!("{flag} needs a value"),
            advice,
        )
    })
}

fn families(list: &str) -> Result<Vec<String>, BenchError> {
    let mut picked = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let name = item.to_ascii_uppercase();
        if !FAMILIES.contains(&name.as_str()) {
            return Err(BenchError::new(
                "reading the command line",
                format!("--only names an unknown scenario family {item:?}"),
                "use P1, P2, P3, P4, P5 or P6, comma-separated",
            ));
        }
        picked.push(name);
    }
    if picked.is_empty() {
        return Err(BenchError::new(
            "reading the command line",
            "--only names no scenario family",
            "use for example `--only P1,P4`",
        ));
    }
    Ok(picked)
}
