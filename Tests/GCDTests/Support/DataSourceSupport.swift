import GCD

/// A resumed data source of `kind` on `queue` whose event handler appends each event's `data` to
/// `seen`, then signals `called`.
func recordingDataSource(
  _ kind: DataKind, queue: Queue
) -> (source: any MergeableSource, seen: Recorder<UInt>, called: Event) {
  let source = kind.make(queue: queue)
  let seen = Recorder<UInt>()
  let called = Event()
  source.setEventHandler { [unowned source] in
    seen.append(source.data)
    called.signal()
  }
  source.resume()
  return (source, seen, called)
}
