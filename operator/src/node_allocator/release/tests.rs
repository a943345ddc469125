use super::*;

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 213, 0, last)
}

fn answers(pairs: &[(u8, &str)]) -> ReleaseMap {
    pairs
        .iter()
        .map(|(last, state)| (ip(*last).to_string(), (*state).to_owned()))
        .collect()
}

const DELAY: Duration = Duration::from_secs(180);

#[test]
fn nothing_is_marked_before_the_delay_and_nothing_released_before_the_agent_agrees() {
    let start = Instant::now();
    let mut state = ReleaseState::default();
    let candidates = ("eni-1".to_owned(), vec![ip(10), ip(11)]);

    assert!(
        state
            .step(start, DELAY, Some(&candidates), &ReleaseMap::new())
            .is_empty()
    );
    assert!(
        state.publish(&ReleaseMap::new()).is_empty(),
        "marked too early"
    );

    let later = start + DELAY;
    assert!(
        state
            .step(later, DELAY, Some(&candidates), &ReleaseMap::new())
            .is_empty()
    );
    let published = state.publish(&ReleaseMap::new());
    assert_eq!(
        published,
        answers(&[(10, MARKED_FOR_RELEASE), (11, MARKED_FOR_RELEASE)])
    );

    // The agent agrees to one and refuses the other.
    let agent = answers(&[(10, READY_FOR_RELEASE), (11, DO_NOT_RELEASE)]);
    assert_eq!(
        state.publish(&agent),
        agent,
        "the agent's answers are kept while marked"
    );
    let ready = state.step(later, DELAY, Some(&candidates), &agent);
    assert_eq!(ready, BTreeMap::from([("eni-1".to_owned(), vec![ip(10)])]));
    state.released(&[ip(10)]);
    assert_eq!(
        state.publish(&agent),
        answers(&[(10, RELEASED)]),
        "refused address forgotten"
    );

    // The agent removes the released entry: the handshake is over.
    let candidates = ("eni-1".to_owned(), Vec::new());
    assert!(
        state
            .step(later, DELAY, Some(&candidates), &ReleaseMap::new())
            .is_empty()
    );
    assert!(state.is_idle());
}

#[test]
fn an_address_no_longer_in_excess_leaves_the_handshake() {
    let now = Instant::now();
    let mut state = ReleaseState::default();
    let both = ("eni-1".to_owned(), vec![ip(10), ip(11)]);
    state.step(now, Duration::ZERO, Some(&both), &ReleaseMap::new());
    let one = ("eni-1".to_owned(), vec![ip(11)]);
    // 10 got used meanwhile; the agent's late agreement must not release it.
    let agent = answers(&[(10, READY_FOR_RELEASE), (11, MARKED_FOR_RELEASE)]);
    assert!(
        state
            .step(now, Duration::ZERO, Some(&one), &agent)
            .is_empty()
    );
    assert_eq!(state.publish(&agent), answers(&[(11, MARKED_FOR_RELEASE)]));
}

#[test]
fn a_stale_agreement_counts_only_after_the_mark() {
    let now = Instant::now();
    let mut state = ReleaseState::default();
    let candidates = ("eni-1".to_owned(), vec![ip(10)]);
    let agent = answers(&[(10, READY_FOR_RELEASE)]);
    assert!(
        state
            .step(now, Duration::ZERO, Some(&candidates), &agent)
            .is_empty(),
        "first marked, then released"
    );
    assert_eq!(
        state
            .step(now, Duration::ZERO, Some(&candidates), &agent)
            .len(),
        1
    );
}

#[test]
fn a_released_entry_the_agent_removed_is_not_written_back() {
    let now = Instant::now();
    let mut state = ReleaseState::default();
    let candidates = ("eni-1".to_owned(), vec![ip(10)]);
    state.step(now, Duration::ZERO, Some(&candidates), &ReleaseMap::new());
    let agent = answers(&[(10, READY_FOR_RELEASE)]);
    assert_eq!(
        state
            .step(now, Duration::ZERO, Some(&candidates), &agent)
            .len(),
        1
    );
    state.released(&[ip(10)]);
    assert_eq!(state.publish(&agent), answers(&[(10, RELEASED)]));
    // A publish racing the agent's removal (composed onto the object without the entry)
    // must not bring it back, or the handshake would never end.
    assert!(state.publish(&ReleaseMap::new()).is_empty());
    let gone = ("eni-1".to_owned(), Vec::new());
    state.step(now, Duration::ZERO, Some(&gone), &ReleaseMap::new());
    assert!(state.is_idle());
}
