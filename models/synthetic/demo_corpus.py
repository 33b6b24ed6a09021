"""Training text for the locally trained demo/test tokenizer.

Original prose written for graphtop (no third-party text), varied enough that byte-level
BPE learns on the order of a thousand merges. Changing it changes the demo tokenizer:
bump the demo folder version in demo.py if you do.
"""

CORPUS = """\
The lighthouse keeper woke before the gulls, as he had every morning for thirty years.
He climbed the spiral stairs, counted the one hundred and twelve steps, and wiped the
salt from the great glass lens. Below him the harbour was still dark, and the fishing
boats rocked against their ropes like sleeping horses. He wrote the weather in his
ledger: wind from the north-west, force four; sea moderate; visibility good; barometer
rising slowly. Then he made tea, strong and sweet, and watched the sky turn from iron
to pearl to pale blue.

In the village, the baker had already lit her ovens. Flour hung in the air of the small
kitchen like fog over a field. She kneaded the dough with the heels of her hands, folded
it, turned it, and kneaded again. Her grandmother had taught her that bread listens to
patience more than to recipes. By six o'clock the first loaves were cooling on the rack,
their crusts crackling softly as they shrank. Children on their way to school pressed
their noses to the window and argued about which loaf was the largest.

A river runs through every old town, and this town was no exception. The river was slow
and brown in summer, quick and grey in winter, and it carried leaves, branches, and the
occasional lost boot down to the sea. The bridge over it had been rebuilt four times:
once after a flood, once after a fire, once because a careless merchant drove a cart of
stones across it, and once simply because the mayor wanted a bridge with lamps on it.

Machines have their own kind of weather. A computer under heavy load grows warm, its
fans rise in pitch, and its memory fills like a reservoir after rain. Engineers who
build inference servers learn to read these signs: the steady hum of a well-fed graphics
processor, the stutter of a queue that is waiting for data, the sudden silence when a
process crashes. They measure everything: tokens per second, time to first token,
latency at the fiftieth and ninety-ninth percentile, memory used by the key-value cache.

To cook a simple soup, chop two onions, three carrots, and a stalk of celery. Warm a
spoonful of oil in a heavy pot and let the vegetables soften over a low flame for ten
minutes, stirring now and then. Add a litre of stock, a bay leaf, a pinch of salt, and
whatever beans or lentils you have in the cupboard. Simmer for forty minutes. Taste it,
add pepper, and serve it with the bread from the baker on the corner.

The mathematician drew a circle on the blackboard and asked the class what it meant.
One student said it was the set of points at equal distance from a centre. Another said
it was the path of a planet, nearly. A third said it was zero, the beginning of counting.
The mathematician smiled and said they were all correct, which is the most annoying
answer a teacher can give. Then she wrote: x squared plus y squared equals r squared,
and the room became quiet in the way rooms do when people are thinking.

Numbers appear everywhere once you look for them: 1, 2, 3, 5, 8, 13, 21, 34, 55, 89.
The year 2024 had 366 days. A kilometre is 1000 metres, and a mile is about 1609 metres.
Water boils at 100 degrees Celsius at sea level and freezes at 0. The speed of light is
roughly 299792 kilometres per second. A byte has 8 bits; a kilobyte has 1024 bytes;
a gigabyte holds more text than a person could read in a lifetime of quiet evenings.

def greet(name: str) -> str:
    return f"Hello, {name}! How are you today?"

for i in range(10):
    print(i, i * i, greet("world"))

class Counter:
    def __init__(self) -> None:
        self.count = 0

    def increment(self, step: int = 1) -> int:
        self.count += step
        return self.count

The old library smelled of dust, leather, and wax. Its shelves rose to the ceiling and
were reached by wooden ladders on brass rails. The librarian knew where every book lived,
even the ones that had been misplaced for decades. When a visitor asked for a book about
the history of clocks, she walked without hesitation to the third floor, turned left at
the globe, and pulled down a thin green volume with a cracked spine. "Nobody has asked
for this one since before the war," she said, and blew the dust from its pages.

Autumn came early that year. The orchards were heavy with apples, red and gold and
speckled green, and the farmers hired every pair of hands they could find. Students,
grandparents, and travellers climbed ladders into the branches and filled canvas bags
until their shoulders ached. In the evenings they sat at long tables in the barn, ate
stew and cheese and pie, and sang songs whose words nobody fully remembered.

Question: What is the capital of a country that has no cities?
Answer: That is a riddle, not a question of geography. Every answer is a little wrong.
Question: Why does the sky look blue?
Answer: Air scatters short blue wavelengths of sunlight more strongly than red ones, so
blue light reaches our eyes from every direction of the sky.
Question: How many legs does a spider have?
Answer: Eight, although some people insist on counting the ones that are missing.

The train left the station at seven minutes past nine. It passed warehouses and gardens,
then fields of wheat and sunflowers, then a long tunnel through the mountain where the
lights flickered and the passengers' reflections appeared in the windows like ghosts.
On the other side the valley opened into vineyards and small stone houses with blue
shutters. A conductor walked through the carriages, punching tickets and wishing everyone
a pleasant journey in three languages.

Good software is like a good kitchen: every tool has a place, the surfaces are clean,
and anyone who walks in can find the salt. Bad software is like a kitchen after a party:
it still works, technically, but nobody wants to touch anything. Refactoring is the
washing up. Tests are the smoke alarm. Documentation is the note on the fridge that says
which shelf belongs to whom, and why the blue pan must never go in the dishwasher.

Snow fell through the night and covered the town in silence. In the morning, the streets
were white and unmarked, except for the tracks of a fox that had crossed the square and
disappeared between the church and the post office. Shopkeepers cleared their doorsteps
with wide shovels, children built forts and fought wars with soft cannonballs, and the
lighthouse keeper, looking down from his tower, wrote in his ledger: snow, calm, bright.
"""
