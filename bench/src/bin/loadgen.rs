//! Standalone load generator: the same flags as `narad bench`, without the broker binary (used
//! by bench/run.sh so that the generator can be built and run on its own).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Narad load generator (W1..W4, see bench/README.md)"
)]
struct Cli {
    #[command(flatten)]
    args: narad_bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = narad_bench::run_cli(cli.args) {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
}
