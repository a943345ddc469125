//! Both tables, driven through the same re-list and checked against each other.

use std::collections::BTreeMap;

use super::*;

/// A value that names its key, as an ipcache entry does.
#[derive(Debug, Clone, PartialEq)]
struct Named {
    key: String,
    value: u32,
}

impl KeyedValue for Named {
    fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.key.as_bytes())
    }
}

fn named(key: &str, value: u32) -> Named {
    Named {
        key: key.to_owned(),
        value,
    }
}

/// What an upsert did, without the borrow: `u` unchanged, `c` changed, `n` new, `w` wrong key.
fn upsert<T: StoreTable<Named>>(table: &mut T, key: &str, value: Named) -> char {
    match table.upsert(key, value) {
        Upserted::Unchanged => 'u',
        Upserted::Changed(stored) => {
            assert_eq!(stored.key, key);
            'c'
        }
        Upserted::Created(stored) => {
            assert_eq!(stored.key, key);
            'n'
        }
        Upserted::WrongKey => 'w',
    }
}

fn contents<T: StoreTable<Named>>(table: &T, keys: &[&str]) -> BTreeMap<String, u32> {
    keys.iter()
        .filter_map(|key| Some((key.to_string(), table.get(key)?.value)))
        .collect()
}

/// A list, a re-list that fails half way, a full re-list, a delete and a drain; answers
/// every outcome in order, so both tables can be compared.
fn scenario<T: StoreTable<Named>>() -> Vec<String> {
    let keys = ["a", "b", "c", "d", "e"];
    let mut table = T::default();
    let mut log = Vec::new();
    table.reserve_for_list(3);
    let first: String = ["a", "b", "c", "d"]
        .iter()
        .map(|key| upsert(&mut table, key, named(key, 1)))
        .collect();
    log.push(first);
    log.push(format!("{:?}", contents(&table, &keys)));

    // A re-list sees a and b, then fails; the next one sees b (changed), d, e.
    table.mark_stale();
    log.push(format!(
        "{}{}",
        upsert(&mut table, "a", named("a", 1)),
        upsert(&mut table, "b", named("b", 1))
    ));
    table.mark_stale();
    log.push(format!(
        "{}{}{}",
        upsert(&mut table, "b", named("b", 2)),
        upsert(&mut table, "d", named("d", 1)),
        upsert(&mut table, "e", named("e", 1)),
    ));
    // c did not decode this time: it keeps its value and is not stale.
    table.keep("c");
    let mut gone = Vec::new();
    table.remove_stale(|key, value| gone.push(format!("{key}={}", value.value)));
    gone.sort();
    log.push(gone.join(","));
    log.push(format!("{:?} len {}", contents(&table, &keys), table.len()));

    // Watch events after the list.
    log.push(format!(
        "{}{}",
        upsert(&mut table, "e", named("e", 1)),
        upsert(&mut table, "e", named("e", 3))
    ));
    log.push(format!("{:?}", table.remove("b").map(|v| v.value)));
    log.push(format!("{:?}", table.remove("b").map(|v| v.value)));
    let mut drained = Vec::new();
    table.drain(|key, value| drained.push(format!("{key}={}", value.value)));
    drained.sort();
    log.push(drained.join(","));
    log.push(format!("len {}", table.len()));
    log
}

#[test]
fn both_tables_keep_the_store_semantics() {
    let expected = [
        "nnnn",
        r#"{"a": 1, "b": 1, "c": 1, "d": 1}"#,
        "uu",
        "cun",
        "a=1",
        r#"{"b": 2, "c": 1, "d": 1, "e": 1} len 4"#,
        "uc",
        "Some(2)",
        "None",
        "c=1,d=1,e=3",
        "len 0",
    ];
    assert_eq!(scenario::<ByKey<Named>>(), expected);
    assert_eq!(scenario::<ByValue<Named>>(), expected);
}

#[test]
fn a_value_under_another_key_is_refused() {
    let mut table = ByValue::<Named>::default();
    assert_eq!(upsert(&mut table, "a", named("b", 1)), 'w');
    assert_eq!(
        (table.len(), table.get("a"), table.get("b")),
        (0, None, None)
    );
}

#[test]
fn many_entries_survive_growth_and_a_relist() {
    let mut table = ByValue::<Named>::default();
    let keys: Vec<String> = (0..5_000)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    for key in &keys {
        assert_eq!(upsert(&mut table, key, named(key, 1)), 'n');
    }
    table.mark_stale();
    for key in keys.iter().step_by(2) {
        assert_eq!(upsert(&mut table, key, named(key, 1)), 'u');
    }
    let mut gone = 0;
    table.remove_stale(|key, _| {
        assert!(key.ends_with(['1', '3', '5', '7', '9']));
        gone += 1;
    });
    assert_eq!((gone, table.len()), (2_500, 2_500));
    assert!(keys.iter().step_by(2).all(|key| table.get(key).is_some()));
}
