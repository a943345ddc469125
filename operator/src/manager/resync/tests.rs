use super::*;

#[test]
fn requests_coalesce_and_are_spaced_by_the_minimum_interval() {
    let mut scheduler = ResyncScheduler::default();
    let start = Instant::now();
    assert_eq!(scheduler.request(start), ResyncDecision::Start);
    assert_eq!(scheduler.request(start), ResyncDecision::Wait);
    assert_eq!(scheduler.request(start), ResyncDecision::Wait);
    let done = start + Duration::from_millis(200);
    assert_eq!(
        scheduler.finished(done),
        ResyncDecision::At(start + MIN_RESYNC_INTERVAL),
        "the requests made meanwhile cause one more, a second after the last start"
    );
    assert_eq!(scheduler.request(done), ResyncDecision::Wait, "timer armed");
    let fire = start + MIN_RESYNC_INTERVAL;
    assert_eq!(scheduler.timer_fired(fire), ResyncDecision::Start);
    assert_eq!(
        scheduler.finished(fire),
        ResyncDecision::Wait,
        "nothing pending"
    );
    let later = fire + MIN_RESYNC_INTERVAL;
    assert_eq!(scheduler.request(later), ResyncDecision::Start);
}

fn eni(id: &str, tags: &[(&str, &str)]) -> Eni {
    Eni {
        id: id.to_owned(),
        tags: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Eni::default()
    }
}

#[test]
fn gc_deletes_only_tagged_enis_seen_unattached_twice() {
    let ours: Tags = [("meshwork.io/cluster".to_owned(), "c1".to_owned())].into();
    let mut gc = EniGc::default();
    let start = Instant::now();
    let interval = Duration::from_secs(300);
    let first = [
        eni("eni-a", &[("meshwork.io/cluster", "c1")]),
        eni("eni-foreign", &[]),
    ];
    assert!(
        gc.collect(start, interval, &first, &ours).is_empty(),
        "first sighting"
    );
    assert!(
        gc.collect(start, interval, &first, &ours).is_empty(),
        "not before the interval"
    );
    let later = start + interval;
    let second = [
        eni("eni-a", &[("meshwork.io/cluster", "c1")]),
        eni("eni-b", &[("meshwork.io/cluster", "c1")]),
        eni("eni-foreign", &[]),
    ];
    assert_eq!(gc.collect(later, interval, &second, &ours), ["eni-a"]);
    assert!(
        gc.collect(later + interval, interval, &[], &Tags::new())
            .is_empty()
    );
}
