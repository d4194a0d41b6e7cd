//! Standalone load generator: the same flags as `narad bench`, without the broker binary (used
//! by bench/run.sh so that the generator can be built and run on its own). `--smoke` runs the
//! test suite's short correctness run (`narad_bench::smoke`) against `--url` instead.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Narad load generator (W1..W4, see bench/README.md)"
)]
struct Cli {
    /// Run the short W1/W2/W3 correctness check (a few seconds) and exit non-zero on a problem.
    #[arg(long)]
    smoke: bool,
    #[command(flatten)]
    args: narad_bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    if cli.smoke {
        let target = match narad_bench::http::Target::parse(
            cli.args.url.as_deref().unwrap_or(narad_bench::DEFAULT_URL),
        ) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("loadgen: {e}");
                std::process::exit(2);
            }
        };
        match narad_bench::smoke(target.addr) {
            Ok(rep) => {
                let report = narad_bench::Report {
                    ceiling: None,
                    runs: rep.runs.clone(),
                };
                print!("{}", report.table());
                let problems = rep.problems();
                if !problems.is_empty() {
                    eprintln!("loadgen: smoke problems: {problems:?}");
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("loadgen: smoke: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Err(e) = narad_bench::run_cli(cli.args) {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
}
