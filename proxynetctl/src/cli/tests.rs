//! Unit tests of the command line: it is well formed, and parses (or
//! refuses) as the commands expect.

use clap::{CommandFactory, Parser};

use super::{Cli, Command, Dedicated, Exits, Output, PageArgs};

#[test]
fn the_command_line_is_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn global_flags_go_anywhere() {
    let cli = Cli::try_parse_from(["proxynetctl", "exits", "list", "-o", "json", "--all"]).unwrap();
    assert_eq!(cli.global.output, Output::Json);
    assert!(matches!(
        cli.command,
        Command::Exits(Exits::List(PageArgs { all: true, .. }))
    ));
    assert!(
        Cli::try_parse_from(["proxynetctl", "exits", "list", "--all", "--limit", "3"]).is_err()
    );
    assert!(Cli::try_parse_from(["proxynetctl", "keys", "create"]).is_err());
    // A report names its exit one way, exactly.
    let report = [
        "proxynetctl",
        "feedback",
        "--site",
        "example.com",
        "--verdict",
    ];
    assert!(Cli::try_parse_from(report.iter().chain(&["blocked"])).is_err());
    assert!(Cli::try_parse_from(report.iter().chain(&["blocked", "--exit", "e"])).is_ok());
    assert!(Cli::try_parse_from(report.iter().chain(&[
        "blocked",
        "--exit",
        "e",
        "--session",
        "s"
    ]))
    .is_err());
    assert!(Cli::try_parse_from(report.iter().chain(&["banned", "--exit", "e"])).is_err());
    assert!(
        Cli::try_parse_from(report.iter().chain(&["ok", "--exit", "e", "--user", "u"])).is_err()
    );
    assert!(Cli::try_parse_from([
        "proxynetctl",
        "policy",
        "get",
        "--account",
        "a",
        "--user",
        "b"
    ])
    .is_err());
}

#[test]
fn dedicated_addresses_are_asked_for_by_count_or_by_name() {
    let parse = |line: &str| {
        let args = ["proxynetctl", "dedicated"].into_iter();
        Cli::try_parse_from(args.chain(line.split_whitespace())).map(|c| c.command)
    };
    let Ok(Command::Dedicated(Dedicated::Allocate {
        count,
        country,
        source_type,
        ips,
        users,
        ..
    })) = parse("allocate --account a --count 2 --country DE --type dc --user u1,u2 --user u3")
    else {
        panic!("allocate by count");
    };
    assert_eq!(count, Some(2));
    assert_eq!(country.as_deref(), Some("DE"));
    assert_eq!(source_type.as_deref(), Some("dc"));
    assert!(ips.is_empty());
    assert_eq!(users, ["u1", "u2", "u3"]);
    let Ok(Command::Dedicated(Dedicated::Allocate { count, ips, .. })) =
        parse("allocate --account a --ip 127.0.0.2,2001:db8:0:1::/64 --ip 127.0.0.3")
    else {
        panic!("allocate by name");
    };
    assert_eq!(count, None);
    assert_eq!(ips, ["127.0.0.2", "2001:db8:0:1::/64", "127.0.0.3"]);
    // One way or the other, exactly; targeting only with a count.
    for refused in [
        "allocate --account a",
        "allocate --account a --count 1 --ip 127.0.0.2",
        "allocate --account a --ip 127.0.0.2 --country DE",
        "allocate --account a --count 0",
        "allocate --account a --count 1 --type cable",
        "allocate --count 1",
        "release 127.0.0.2",
        "move 127.0.0.2",
    ] {
        assert!(parse(refused).is_err(), "{refused}");
    }
    // No --user: the address serves every user.
    let Ok(Command::Dedicated(Dedicated::Assign { ip, users, .. })) =
        parse("assign --account a 127.0.0.2")
    else {
        panic!("assign");
    };
    assert_eq!(ip, "127.0.0.2");
    assert!(users.is_empty());
    assert!(parse("move 127.0.0.2 --to b").is_ok());
    assert!(parse("map").is_ok());
    assert!(parse("list --account a -o json").is_ok());
}
