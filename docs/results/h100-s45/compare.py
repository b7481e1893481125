import csv,glob,sys,collections
V=sys.argv[1].split(',')
res=collections.defaultdict(list)
for f in glob.glob('*-single-*/single.csv')+glob.glob('*-mixed-*/mixed.csv'):
    v=f.split('/')[0].rsplit('-',2)[0]
    rows=[l for l in open(f) if not l.startswith('#')]
    for r in csv.DictReader(rows):
        if r['allocator']!='ours': continue
        res[(v,r['size_label'],r['metric'])].append(float(r['median']))
sizes=[]
for (v,s,m) in res:
    if s not in sizes: sizes.append(s)
for m in ['alloc_ms','free_ms']:
    print(m, ' '.join(f'{v:>16}' for v in V))
    for s in sizes:
        base=res.get((V[0],s,m))
        if not base: continue
        cells=[]
        for v in V:
            x=res.get((v,s,m),[])
            if not x: cells.append(' '*16); continue
            rng=f'{min(x):.3f}-{max(x):.3f}'
            if v!=V[0]:
                rel=(sum(x)/len(x))/(sum(base)/len(base))-1
                cells.append(f'{rng} {rel:+.0%}'.rjust(16))
            else: cells.append(rng.rjust(16))
        print(f'{s:>10}', ' '.join(cells))
