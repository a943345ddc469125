//! Generated JSON objects for the differential tests of the plain-form shortcuts
//! (`ipcache_shortcut_tests.rs`, `node_shortcut_tests.rs`): each object takes one variant per
//! field, right or wrong, so both readers see both outcomes.

/// Values for each field, right and wrong, as raw JSON (`None`: the field is absent). The
/// first value of each field is its plain, valid one.
pub(crate) type Variants = [(&'static str, &'static [Option<&'static [u8]>])];

/// A value built from one variant per field (the first one more often than the others),
/// fields shuffled, sometimes spaced out and sometimes with a field repeated, all from `seed`.
pub(crate) fn value(seed: &mut u64, variants: &Variants) -> Vec<u8> {
    let mut next = |n: usize| {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % n as u64) as usize
    };
    // Two fields in three keep their first (plain, valid) variant, so a good share of the
    // corpus is in the plain form despite the many wrong variants.
    let mut fields: Vec<(&str, &[u8])> = variants
        .iter()
        .filter_map(|(name, values)| {
            let pick = if next(3) < 2 { 0 } else { next(values.len()) };
            values[pick].map(|v| (*name, v))
        })
        .collect();
    for i in (1..fields.len()).rev() {
        fields.swap(i, next(i + 1));
    }
    if !fields.is_empty() && next(4) == 0 {
        let (name, _) = fields[next(fields.len())];
        let values = variants.iter().find(|(n, _)| *n == name).unwrap().1;
        if let Some(value) = values[next(values.len())] {
            fields.push((name, value));
        }
    }
    let space: &[u8] = if next(5) == 0 { b" \n" } else { b"" };
    let mut out = Vec::from(space);
    out.push(b'{');
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(space);
        out.extend_from_slice(format!("\"{name}\":").as_bytes());
        out.extend_from_slice(space);
        out.extend_from_slice(value);
    }
    out.extend_from_slice(space);
    out.push(b'}');
    if next(50) == 0 {
        out.extend_from_slice(b" x");
    }
    out
}
