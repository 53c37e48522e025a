import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `FileSystemSource` on Linux: one inotify instance, vnode flags merged
/// into a DATA_OR source, the new path after a rename, no descriptor leaks.
@Suite
struct FileSystemSourceTests {
  @Test func renameTwiceGivesTwoEventsAndTheNewPaths() throws {
    let directory = TemporaryDirectory()
    let original = directory.file("original.txt")
    let source = try FileSystemSource(path: original, events: .rename, queue: Queue(label: "fs"))
    #expect(source.path == original)
    #expect(source.mask == FileSystemEvents.rename.rawValue)
    let seen = Recorder<(UInt, String?)>()
    source.setEventHandler { [weak source] in
      guard let source else { return }
      seen.append((source.data, source.path))
    }
    source.resume()
    for (step, name) in ["first.txt", "second.txt"].enumerated() {
      let renamed = directory.path + "/" + name
      #expect(rename(step == 0 ? original : directory.path + "/first.txt", renamed) == 0)
      #expect(pollUntil { seen.count == step + 1 })
      let last = try #require(seen.values.last)
      #expect(last.0 == FileSystemEvents.rename.rawValue)
      #expect(last.1 == renamed)
    }
    #expect(!pollBriefly { seen.count > 2 })
    source.cancel()
  }

  @Test func hundredRenamesAreEachNoticed() throws {
    let directory = TemporaryDirectory()
    var current = directory.file("name-0")
    let source = try FileSystemSource(path: current, events: .rename, queue: Queue(label: "fs"))
    let seen = Recorder<(UInt, String?)>()
    source.setEventHandler { [weak source] in
      guard let source else { return }
      seen.append((source.data, source.path))
    }
    source.resume()
    for step in 1...100 {
      let next = directory.path + "/name-\(step)"
      #expect(rename(current, next) == 0)
      current = next
      // The handler keeps up: wait for this rename's event before the next.
      guard pollUntil({ seen.count >= step }) else {
        Issue.record("rename \(step) was not noticed")
        break
      }
      #expect(seen.values[step - 1].1 == next)
    }
    #expect(!pollBriefly { seen.count > 100 })
    #expect(seen.count == 100)
    #expect(seen.values.allSatisfy { $0.0 == FileSystemEvents.rename.rawValue })
    #expect(source.path == current)
    source.cancel()
  }

  @Test func threeHundredSourcesEachSeeTheirOwnFileRenamed() throws {
    let directory = TemporaryDirectory()
    let count = 300
    let queue = Queue(label: "fs-many", kind: .concurrent)
    let paths = Mutex([String?](repeating: nil, count: count))
    let all = Latch(count: count)
    let sources = try (0..<count).map { index in
      let source = try FileSystemSource(path: directory.file("file-\(index)"), events: .rename, queue: queue)
      source.setEventHandler { [weak source] in
        guard let source else { return }
        #expect(source.data == FileSystemEvents.rename.rawValue)
        let first = paths.withLock { paths in
          defer { paths[index] = source.path }
          return paths[index] == nil
        }
        if first { all.signal() }
      }
      source.resume()
      return source
    }
    for index in 0..<count {
      #expect(rename(directory.path + "/file-\(index)", directory.path + "/renamed-\(index)") == 0)
    }
    #expect(all.wait(), "\(all.count) of \(count) sources saw no rename")
    let seen = paths.withLock { $0 }
    for index in 0..<count {
      #expect(seen[index] == directory.path + "/renamed-\(index)")
    }
    for source in sources { source.cancel() }
  }

  @Test func writeAndExtend() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("data", contents: "12345")
    let source = try FileSystemSource(path: path, events: [.write, .extend], queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    source.resume()
    let descriptor = open(path, O_WRONLY | O_CLOEXEC)
    defer { close(descriptor) }
    // Overwrite in place: the size does not change.
    #expect(pwrite(descriptor, "abc", 3, 0) == 3)
    #expect(pollUntil { seen.count == 1 })
    #expect(seen.values.first == FileSystemEvents.write.rawValue)
    // Append: the file grows.
    #expect(pwrite(descriptor, "6789", 4, 5) == 4)
    #expect(pollUntil { seen.values.contains { $0 & FileSystemEvents.extend.rawValue != 0 } })
    #expect(seen.values.last == FileSystemEvents([.write, .extend]).rawValue)
    source.cancel()
  }

  @Test func attribAndLink() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("data")
    let source = try FileSystemSource(path: path, events: [.attrib, .link], queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    source.resume()
    #expect(chmod(path, 0o600) == 0)
    #expect(pollUntil { seen.count == 1 })
    #expect(seen.values.first == FileSystemEvents.attrib.rawValue)
    #expect(link(path, directory.path + "/hard-link") == 0)
    #expect(pollUntil { seen.count == 2 })
    #expect(seen.values.last == FileSystemEvents([.attrib, .link]).rawValue)
    source.cancel()
  }

  @Test func deleteIsReportedOnceAndThePathGoes() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("doomed")
    let source = try FileSystemSource(path: path, events: .delete, queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    source.resume()
    #expect(unlink(path) == 0)
    #expect(pollUntil { seen.count == 1 })
    #expect(seen.values == [FileSystemEvents.delete.rawValue])
    #expect(source.path == nil)
    #expect(
      !pollBriefly { seen.count > 1 }, "IN_DELETE_SELF after the O_PATH descriptor closes is not a second .delete")
    source.cancel()
  }

  @Test func deleteIsReportedWhileTheCallerStillHoldsTheFile() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("held")
    let descriptor = open(path, O_RDONLY | O_CLOEXEC)
    defer { close(descriptor) }
    let source = try FileSystemSource(
      fileDescriptor: descriptor, events: [.delete, .rename], queue: Queue(label: "fs"))
    #expect(source.handle == UInt(descriptor))
    let seen = recordData(of: source)
    source.resume()
    #expect(rename(path, directory.path + "/moved") == 0)
    #expect(pollUntil { seen.count == 1 })
    #expect(source.path == directory.path + "/moved")
    #expect(unlink(directory.path + "/moved") == 0)
    #expect(pollUntil { seen.count == 2 })
    #expect(seen.values == [FileSystemEvents.rename.rawValue, FileSystemEvents.delete.rawValue])
    source.cancel()
  }

  @Test func directoryEntriesGiveWriteAndSubdirectoriesLink() throws {
    let directory = TemporaryDirectory()
    let watched = directory.path + "/watched"
    #expect(mkdir(watched, 0o700) == 0)
    let source = try FileSystemSource(path: watched, events: [.write, .link], queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    source.resume()
    _ = TemporaryDirectory.create(watched + "/file", contents: "")
    #expect(pollUntil { seen.count == 1 })
    #expect(seen.values.last == FileSystemEvents.write.rawValue)
    #expect(mkdir(watched + "/subdirectory", 0o700) == 0)
    #expect(pollUntil { seen.count == 2 })
    #expect(seen.values.last == FileSystemEvents([.write, .link]).rawValue)
    source.cancel()
  }

  @Test func twoSourcesOnOneFileShareTheWatch() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("shared")
    let first = try FileSystemSource(path: path, events: .rename, queue: Queue(label: "fs-1"))
    let second = try FileSystemSource(path: path, events: [.rename, .attrib], queue: Queue(label: "fs-2"))
    let firstSeen = recordData(of: first)
    let secondSeen = recordData(of: second)
    first.resume()
    second.resume()
    #expect(rename(path, directory.path + "/a") == 0)
    #expect(pollUntil { firstSeen.count == 1 && secondSeen.count == 1 })
    // The first goes: the shared kernel watch must stay for the second.
    let cancelled = Event()
    first.setCancelHandler { cancelled.signal() }
    first.cancel()
    #expect(cancelled.wait())
    #expect(rename(directory.path + "/a", directory.path + "/b") == 0)
    #expect(chmod(directory.path + "/b", 0o600) == 0)
    #expect(pollUntil { secondSeen.values.reduce(0, |) & FileSystemEvents.attrib.rawValue != 0 })
    #expect(secondSeen.values.reduce(0, |) == FileSystemEvents([.rename, .attrib]).rawValue)
    #expect(second.path == directory.path + "/b")
    #expect(firstSeen.count == 1)
    second.cancel()
  }

  @Test("three sources on one file: the middle one and the newest go, the oldest still sees its events")
  func threeSourcesOnOneFileLoseTwo() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("shared3")
    let sources = try (0..<3).map { index in
      try FileSystemSource(path: path, events: .attrib, queue: Queue(label: "fs3-\(index)"))
    }
    let seen = (0..<3).map { _ in Recorder<UInt>() }
    for (source, recorder) in zip(sources, seen) {
      source.setEventHandler { (events: FileSystemEvents) in recorder.append(events.rawValue) }
      source.resume()
    }
    #expect(chmod(path, 0o600) == 0)
    #expect(pollUntil { seen.allSatisfy { $0.count >= 1 } })
    // The newest registration is the first of the descriptor's list, the middle one inside it.
    for index in [1, 2] {
      let cancelled = Event()
      sources[index].setCancelHandler { cancelled.signal() }
      sources[index].cancel()
      #expect(cancelled.wait())
    }
    let before = seen[0].count
    #expect(chmod(path, 0o644) == 0)
    #expect(pollUntil { seen[0].count > before })
    #expect(seen[1].count == 1 && seen[2].count == 1)
    sources[0].cancel()
  }

  @Test func eventsBeforeResumeAreNotDelivered() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("early")
    let source = try FileSystemSource(path: path, events: .rename, queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    // A witness that is running: once it has seen the rename, the router
    // has routed it to every source on the file.
    let witness = try FileSystemSource(path: path, events: .rename, queue: Queue(label: "witness"))
    let witnessed = Counter()
    witness.setEventHandler { witnessed.increment() }
    witness.resume()
    #expect(rename(path, directory.path + "/early-2") == 0)
    #expect(pollUntil { witnessed.current == 1 })
    source.resume()
    #expect(!pollBriefly { seen.count > 0 }, "a vnode source watches from its first resume()")
    #expect(rename(directory.path + "/early-2", directory.path + "/early-3") == 0)
    #expect(pollUntil { seen.count == 1 })
    #expect(source.path == directory.path + "/early-3")
    source.cancel()
    witness.cancel()
  }

  @Test func eventsWhileSuspendedMergeIntoOne() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("merged")
    // The witness first: the inotify reader hands each event to the watches of a file newest
    // first, so the source's merge of an event precedes the witness's, and a witness that has seen
    // both events means the source has both merged (made in the other order, the test resumed the
    // source between the reader's two merges: seen once in a full-suite run, [8, 32]).
    let witness = try FileSystemSource(path: path, events: [.rename, .attrib], queue: Queue(label: "witness"))
    let source = try FileSystemSource(path: path, events: [.rename, .attrib], queue: Queue(label: "fs"))
    let seen = recordData(of: source)
    let witnessed = recordData(of: witness)
    witness.resume()
    source.resume()
    source.suspend()
    #expect(chmod(path, 0o600) == 0)
    #expect(rename(path, directory.path + "/merged-2") == 0)
    #expect(pollUntil { witnessed.values.reduce(0, |) == FileSystemEvents([.rename, .attrib]).rawValue })
    #expect(seen.count == 0)
    source.resume()
    #expect(pollUntil { seen.count == 1 })
    #expect(!pollBriefly { seen.count > 1 })
    #expect(seen.values == [FileSystemEvents([.rename, .attrib]).rawValue])
    source.cancel()
    witness.cancel()
  }

  @Test(
    "a source that watches only .write lets a deleted file go: its O_PATH descriptor is closed, the space freed (issue 53)",
    arguments: [FileSystemEvents.write, .extend, .rename])
  func deletedFileLetGoWhateverTheEvents(_ events: FileSystemEvents) throws {
    let directory = TemporaryDirectory()
    let path = directory.file("rotated.log")
    let file = open(path, O_WRONLY | O_CLOEXEC)
    #expect(file >= 0)
    _ = [UInt8](repeating: 1, count: 100_000).withUnsafeBytes { write(file, $0.baseAddress, $0.count) }
    close(file)
    let source = try FileSystemSource(path: path, events: events, queue: Queue(label: "fs.deleted"))
    let seen = Recorder<UInt>()
    source.setEventHandler { seen.append(source.data) }
    source.resume()
    #expect(unlink(path) == 0)
    /// The descriptors of this process that still hold the deleted file.
    func holders() -> [String] {
      (0..<4096).compactMap { number -> String? in
        var target = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/fd/\(number)", &target, target.count - 1)
        guard count > 0 else { return nil }
        let name = String(decoding: target[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name == path + " (deleted)" ? name : nil
      }
    }
    #expect(pollUntil { source.path == nil && holders().isEmpty }, "\(holders())")
    // Not asked for: no event.
    #expect(!pollBriefly { seen.count > 0 }, "\(seen.values)")
    source.cancel()
    withExtendedLifetime(directory) {}
  }

  @Test func pathIsNilAfterCancel() throws {
    let directory = TemporaryDirectory()
    let path = directory.file("cancelled")
    let source = try FileSystemSource(path: path, events: .rename, queue: Queue(label: "fs"))
    let cancelled = Event()
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    source.cancel()
    #expect(cancelled.wait())
    #expect(pollUntil { source.path == nil })
  }

  @Test func missingPathThrowsENOENTNamingThePath() {
    let path = "/tmp/GCDTests-no-such-file-\(getpid())"
    let error = #expect(throws: GCDError.self) {
      try FileSystemSource(path: path, events: .rename, queue: .global())
    }
    #expect(error?.errno == ENOENT)
    #expect(error?.description.contains(path) == true)
  }

  @Test func badDescriptorThrowsEBADF() {
    let error = #expect(throws: GCDError.self) {
      try FileSystemSource(fileDescriptor: 9_999, events: .rename, queue: .global())
    }
    #expect(error?.errno == EBADF)
  }

  @Test func emptyEventsThrowEINVAL() {
    let error = #expect(throws: GCDError.self) {
      try FileSystemSource(path: "/tmp", events: FileSystemEvents(), queue: .global())
    }
    #expect(error?.errno == EINVAL)
  }

  @Test("unknown event bits stop the process with a message naming FileSystemSource, as for every option set")
  func unknownEventBitsStop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = try? FileSystemSource(path: "/tmp", events: FileSystemEvents(rawValue: 0x102), queue: .global())
    }
    let text = standardError(of: result)
    #expect(text.contains("GCD: FileSystemSource(path: \"/tmp\""), "\(text)")
    #expect(text.contains("libdispatch knows no such file-system event (bits 0x100)"), "\(text)")
  }

  @Test func rawValuesMatchTheCFlags() {
    #expect(FileSystemEvents.delete.rawValue == 0x1)
    #expect(FileSystemEvents.write.rawValue == 0x2)
    #expect(FileSystemEvents.extend.rawValue == 0x4)
    #expect(FileSystemEvents.attrib.rawValue == 0x8)
    #expect(FileSystemEvents.link.rawValue == 0x10)
    #expect(FileSystemEvents.rename.rawValue == 0x20)
    #expect(FileSystemEvents.revoke.rawValue == 0x40)
    #expect(FileSystemEvents([.write, .rename]).description == "[.write, .rename]")
  }

  @Test func everyDescriptorIsCloseOnExec() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkFileSystemDescriptorsAreCloseOnExec()
    }
    let message = standardError(of: result)
    #expect(message.contains("FileSystemSourceTests child: ok"), "\(message)")
  }

  @Test func thousandSourcesInEveryStateLeakNoDescriptorAndNoWatch() async {
    // In a child process: no other test opens descriptors meanwhile.
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkThousandFileSystemSourcesLeakNothing()
    }
    let message = standardError(of: result)
    #expect(message.contains("FileSystemSourceTests child: ok"), "\(message)")
  }
}

// MARK: - Exit-test bodies

private func checkFileSystemDescriptorsAreCloseOnExec() -> Never {
  warmUpDispatch()
  let directory = TemporaryDirectory()
  let path = directory.file("cloexec")
  let before = openDescriptorTargets()
  let source: FileSystemSource
  do {
    source = try FileSystemSource(path: path, events: .rename, queue: .global())
  } catch {
    endFileSystemChild("\(error)")
  }
  let opened = openDescriptorTargets().filter { before[$0.key] == nil }
  guard opened.values.contains(where: { $0.contains("inotify") }) else {
    endFileSystemChild("no inotify descriptor: \(opened)")
  }
  guard opened.values.contains(path) else { endFileSystemChild("no O_PATH descriptor on the file: \(opened)") }
  for (descriptor, target) in opened where fcntl(descriptor, F_GETFD) & FD_CLOEXEC == 0 {
    endFileSystemChild("descriptor \(descriptor) (\(target)) lacks FD_CLOEXEC")
  }
  source.resume()
  source.cancel()
  guard pollUntil({ !openDescriptorTargets().values.contains(path) }) else {
    endFileSystemChild("O_PATH not closed on cancel")
  }
  TemporaryDirectory.remove(directory.path)
  endFileSystemChild("ok")
}

private func checkThousandFileSystemSourcesLeakNothing() -> Never {
  warmUpDispatch()
  let directory = TemporaryDirectory()
  // The first source creates the process's inotify instance, which stays.
  do {
    guard (try? FileSystemSource(path: directory.path, events: .write, queue: .global())) != nil else {
      endFileSystemChild("warm-up")
    }
  }
  // Only the descriptors the sources can own: O_PATH ones on the test's files and inotify instances.
  let owned = { (target: String) in target.hasPrefix(directory.path) || target.contains("inotify") }
  // The warm-up source's watch goes, and its O_PATH descriptor is closed after it, when its cancel
  // path runs: the baseline waits for both (a CI run took it with the descriptor still open, "2
  // before, 1 after", and the child then polled for 30 s, holding the parent's cooperative threads).
  guard
    pollUntil({
      inotifyWatchCount() == 0 && !openDescriptorTargets().values.contains(where: { $0.hasPrefix(directory.path) })
    })
  else { endFileSystemChild("warm-up watch or its descriptor not removed") }
  let baseline = openDescriptorCount(where: owned)
  createAndDropThousandFileSystemSources(directory: directory, baseline: baseline, owned: owned)
  guard pollUntil({ openDescriptorCount(where: owned) == baseline }) else {
    endFileSystemChild(
      "descriptors: \(baseline) before, \(openDescriptorCount(where: owned)) after dropping 1,000 sources")
  }
  guard pollUntil({ inotifyWatchCount() == 0 }) else {
    endFileSystemChild("\(inotifyWatchCount()) inotify watches left after dropping every source")
  }
  TemporaryDirectory.remove(directory.path)
  endFileSystemChild("ok")
}

/// 1,000 sources on 20 files (so watch descriptors are shared), in six
/// states; all dropped on return.
private func createAndDropThousandFileSystemSources(
  directory: TemporaryDirectory, baseline: Int, owned: (String) -> Bool
) {
  let queue = Queue(label: "fs-many")
  let paths = (0..<20).map { directory.file("file-\($0)") }
  let doomed = directory.file("doomed")
  let held = open(paths[0], O_RDONLY | O_CLOEXEC)
  defer { close(held) }
  let deleted = Latch(count: (0..<1000).filter { $0 % 6 == 5 }.count)
  var sources: [FileSystemSource] = []
  for index in 0..<1000 {
    let kind = index % 6
    let path = kind == 5 ? doomed : paths[index % 20]
    let created =
      kind == 4
      ? try? FileSystemSource(fileDescriptor: held, events: [.write, .rename], queue: queue)
      : try? FileSystemSource(path: path, events: [.delete, .rename, .write, .attrib], queue: queue)
    guard let source = created else { endFileSystemChild("create \(index)") }
    switch kind {
    case 0: break  // never resumed
    case 1: source.resume()  // running, dropped
    case 2:  // cancelled
      source.resume()
      source.cancel()
    case 3:  // suspended, dropped
      source.resume()
      source.suspend()
    case 4: source.resume()  // on the caller's descriptor
    default:  // on a file that gets deleted
      let deletes = Counter()
      source.setEventHandler { [weak source] in
        guard let source, source.data & FileSystemEvents.delete.rawValue != 0 else { return }
        if deletes.increment() == 1 { deleted.signal() }
      }
      source.resume()
    }
    sources.append(source)
  }
  guard openDescriptorCount(where: owned) >= baseline + 600 else {
    endFileSystemChild("expected one O_PATH descriptor per source")
  }
  guard unlink(doomed) == 0 else { endFileSystemChild("unlink") }
  requireInChild(deleted, "delete events")
}

// MARK: - Helpers

/// Ends an exit test's child, reporting `message` on standard error, where
/// the parent looks for "ok" (the status stays 0 so that the parent gets
/// the message; a crash still fails the status check).
private func endFileSystemChild(_ message: String) -> Never {
  let text = Array("FileSystemSourceTests child: \(message)\n".utf8)
  _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
  exit(0)
}

/// Records `source`'s data at each of its events (while the source is alive); does not resume it.
private func recordData(of source: FileSystemSource) -> Recorder<UInt> {
  let seen = Recorder<UInt>()
  source.setEventHandler { [weak source] in
    if let source { seen.append(source.data) }
  }
  return seen
}
