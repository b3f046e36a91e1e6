//! Config: every URL form, malformed input, feature-off schemes, TTLs and
//! waits from the environment, and the TOML/JSON round trip.

use std::time::Duration;

use distlock::{Config, Error, Settings, Wait};

fn invalid(r: Result<Config, Error>) -> String {
    match r {
        Err(Error::InvalidConfig(msg)) => msg,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn malformed_urls_name_the_problem() {
    for (url, needle) in [
        ("", "not a URL"),
        ("127.0.0.1:6379", "not a URL"),
        ("ftp://h:1", "unknown URL scheme \"ftp\""),
        ("mem://something", "mem:// takes nothing"),
        ("redis://", "missing host"),
        ("etcd://h1:2379,,h2:2379", "missing host"),
        ("zk://h:port", "port \"port\""),
    ] {
        let msg = invalid(Config::from_url(url));
        assert!(msg.contains(needle), "{url:?}: {msg}");
    }
}

#[test]
fn mem_is_always_there() {
    assert_eq!(Config::from_url("mem://").unwrap(), Config::Mem);
    let c = Config::from_toml("backend = \"mem\"").unwrap();
    assert_eq!(c.backend(), "mem");
}

#[test]
fn ttls_and_waits_from_the_environment() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    };
    let s = Settings::from_vars(vars(&[
        ("DLOCK_URL", "mem://"),
        ("DLOCK_TTL", "45s"),
        ("DLOCK_WAIT", "2s"),
    ]))
    .unwrap();
    assert_eq!(s.options.ttl, Duration::from_secs(45));
    assert_eq!(s.options.wait, Wait::For(Duration::from_secs(2)));
    let s = Settings::from_vars(vars(&[
        ("DLOCK_URL", "mem://"),
        ("DLOCK_WAIT", "no"),
        ("DLOCK_NO_AUTO_EXTEND", "1"),
    ]))
    .unwrap();
    assert_eq!(s.options.wait, Wait::No);
    assert!(!s.options.auto_extend);
    for (vars, needle) in [
        (vars(&[("DLOCK_URL", "mem://"), ("DLOCK_TTL", "0s")]), "DLOCK_TTL"),
        (
            vars(&[("DLOCK_URL", "mem://"), ("DLOCK_TTL", "400d")]),
            "DLOCK_TTL",
        ),
        (
            vars(&[("DLOCK_URL", "mem://"), ("DLOCK_TTL", "soon")]),
            "DLOCK_TTL",
        ),
        (
            vars(&[("DLOCK_URL", "mem://"), ("DLOCK_WAIT", "later")]),
            "DLOCK_WAIT",
        ),
        (vars(&[("DLOCK_URL", "nope")]), "DLOCK_URL"),
        (vars(&[]), "--url"),
    ] {
        match Settings::from_vars(vars) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(needle), "{needle}: {msg}"),
            other => panic!("{needle}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[test]
fn unknown_backends_and_fields_are_refused() {
    let msg = invalid(Config::from_toml("backend = \"consul\""));
    assert!(msg.contains("consul"), "{msg}");
    assert!(Config::from_json("{}").is_err());
}

/// With the drivers built in (the workspace builds `distlock` with all features
/// for the CLI), every URL form parses to the right backend and settings.
#[cfg(feature = "full")]
mod with_drivers {
    use super::*;

    #[test]
    fn every_url_form_parses_to_its_backend() {
        for (url, backend) in [
            ("redis://127.0.0.1:6379", "redis"),
            ("redis://user:pw@h:6379/2", "redis"),
            ("rediss://h:6380", "redis"),
            ("redis-cluster://h1:7000?node=h2:7001", "redis"),
            ("redlock://h1:6379,h2:6379,h3:6379", "redlock"),
            ("redlock://:pw@h1,h2,h3", "redlock"),
            ("etcd://h1:2379,h2:2379", "etcd"),
            ("etcds://u:p@h1:2379", "etcd"),
            ("etcd://h1", "etcd"),
            ("zk://h1:2181,h2:2181/app", "zk"),
            ("zk://u:p@h1", "zk"),
        ] {
            let c = Config::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.backend(), backend, "{url}");
            // Passwords never show.
            assert!(
                !format!("{c:?}").contains(":pw@") && !format!("{c:?}").contains("\"p\""),
                "{url}: {c:?}"
            );
        }
        let Config::Etcd(e) = Config::from_url("etcds://u:p@h1,h2:1234").unwrap() else {
            panic!()
        };
        assert_eq!(e.endpoints, ["https://h1:2379", "https://h2:1234"]);
        assert_eq!(
            (e.user.as_deref(), e.password.as_deref(), e.tls),
            (Some("u"), Some("p"), true)
        );
        let Config::Zk(z) = Config::from_url("zk://h1,h2:2182/app").unwrap() else {
            panic!()
        };
        assert_eq!(z.connect, "h1:2181,h2:2182/app");
        let Config::Redlock(r) = Config::from_url("redlock://:pw@h1,h2,h3:7000").unwrap() else {
            panic!()
        };
        assert_eq!(
            r.nodes,
            [
                "redis://:pw@h1:6379",
                "redis://:pw@h2:6379",
                "redis://:pw@h3:7000"
            ]
        );
    }

    /// A password holding `/` (unencoded) is refused, and no piece of it is
    /// shown as a host or a port; an `@` in a chroot is not taken for the end
    /// of a password.
    #[test]
    fn a_password_with_a_slash_is_refused_and_never_shown() {
        for url in [
            "redis://:sec/ret@h:6379/0",
            "etcd://u:s/e?c@r@h1:2379",
            "zk://u:p/w@h1",
        ] {
            let msg = invalid(Config::from_url(url));
            assert!(msg.contains("percent-encoded"), "{url}: {msg}");
            for piece in ["sec", "ret", "s/e", "c@r", "p/w"] {
                assert!(
                    !msg.contains(piece),
                    "{url}: a piece of the password shows: {msg}"
                );
            }
        }
        let Config::Zk(z) = Config::from_url("zk://u:p@h1:2181/team@x").unwrap() else {
            panic!()
        };
        assert_eq!(z.connect, "h1:2181/team@x");
    }

    #[test]
    fn per_backend_rules_are_checked() {
        assert!(invalid(Config::from_url("redlock://h1,h2")).contains("odd number"));
        assert!(invalid(Config::from_url("redis://h1:1,h2:2")).contains("one Redis server"));
        assert!(invalid(Config::from_url("etcd://h:1/path")).contains("no path"));
        assert!(invalid(Config::from_url("zk://h:1/a//b")).contains("chroot"));
    }

    #[test]
    fn config_round_trips_through_toml_and_json() {
        for url in [
            "mem://",
            "redis://h:6379/1",
            "redlock://h1,h2,h3",
            "etcds://u:p@h1,h2",
            "zk://h1,h2/app",
        ] {
            let c = Config::from_url(url).unwrap();
            let toml = c.to_toml().unwrap();
            assert_eq!(Config::from_toml(&toml).unwrap(), c, "{url} via TOML:\n{toml}");
        }
        let c = Config::from_toml(
            "backend = \"etcd\"\nendpoints = [\"http://a:2379\"]\nkey_prefix = \"x/\"\nrequest_timeout = \"2s\"\n",
        )
        .unwrap();
        let Config::Etcd(e) = &c else { panic!("{c:?}") };
        assert_eq!(e.request_timeout, Duration::from_secs(2));
        let msg = invalid(Config::from_toml("backend = \"etcd\"\nendpointz = []\n"));
        assert!(msg.contains("endpointz"), "the unknown field is named: {msg}");
        let json = Config::from_json(r#"{"backend": "redis", "url": "redis://h:1"}"#).unwrap();
        assert_eq!(json.backend(), "redis");
    }
}

/// Built alone (`cargo test -p distlock`, which `cargo xtask test` runs), no
/// driver is compiled in: their schemes say which feature to enable.
#[cfg(not(feature = "full"))]
mod without_drivers {
    use super::*;

    #[test]
    fn a_scheme_whose_feature_is_off_names_the_feature() {
        for (url, feature) in [
            ("redis://h:6379", "redis"),
            ("redlock://h1,h2,h3", "redlock"),
            ("etcd://h:2379", "etcd"),
            ("zk://h:2181", "zk"),
        ] {
            let msg = invalid(Config::from_url(url));
            assert!(
                msg.contains(&format!("cargo feature `{feature}`")),
                "{url}: {msg}"
            );
        }
    }

    #[tokio::test]
    async fn a_config_file_for_a_missing_backend_loads_but_does_not_connect() {
        let c = Config::from_toml("backend = \"etcd\"\nendpoints = [\"http://h:2379\"]").unwrap();
        match distlock::connect(&c).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("cargo feature `etcd`"), "{msg}"),
            other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
        }
    }
}
