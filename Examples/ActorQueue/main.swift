// An actor whose executor is a dispatch queue: every method runs on the
// queue, whoever calls it. Eight tasks call it concurrently; each call
// checks that it runs on the queue, and the count shows no update was lost.
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

actor Inventory {
  let queue = SerialQueue(label: "inventory")
  private var items: [String: Int] = [:]
  private(set) var callsOnQueue = 0

  // The actor's executor is the queue.
  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }

  func add(_ item: String) {
    Queue.precondition(.onQueue(queue))  // stops the program if not
    if queue.isCurrent { callsOnQueue += 1 }
    items[item, default: 0] += 1
  }

  func total() -> Int { items.values.reduce(0, +) }
}

let inventory = Inventory()
let callers = 8
let callsPerCaller = 1_000

await withTaskGroup(of: Void.self) { group in
  for caller in 0..<callers {
    group.addTask {
      for call in 0..<callsPerCaller {
        await inventory.add("item-\((caller + call) % 10)")
      }
    }
  }
}

// A task that prefers the actor's queue calls it without a thread hop, and
// its own (nonisolated) code runs on the queue too. (Top-level code is on
// the main actor, so the preference is used from a nonisolated function.)
func addPreferringQueue(_ inventory: Inventory) async -> Bool {
  await withTaskExecutorPreference(inventory.queue) {
    await inventory.add("preferred")
    return inventory.queue.isCurrent
  }
}
let preferred = await addPreferringQueue(inventory)

let total = await inventory.total()
let onQueue = await inventory.callsOnQueue
print("calls: \(total), on the actor's queue: \(onQueue), preferring task on the queue: \(preferred)")
if total != callers * callsPerCaller + 1 || onQueue != total || !preferred {
  print("FAILED")
  exit(1)
}
