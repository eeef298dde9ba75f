//! Arguments more than one resource's subcommands take.

use clap::Args;

/// How much of a paginated list to fetch (the API's pages: ?limit=&after=).
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct PageArgs {
    /// At most N rows in all, following pages as needed [default: the API's first page]
    #[arg(long, value_name = "N", conflicts_with = "all", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) limit: Option<u64>,
    /// Every row: follow each page's Link rel=next
    #[arg(long)]
    pub(crate) all: bool,
    /// Rows per request, 1 to 1000 [default: 1000 with --all or --limit, else the API's]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) page_size: Option<u64>,
}
